//go:build unix

package demo

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// runAsUser is the user a throwaway cluster runs as.
type runAsUser struct {
	name string
	// cred is nil when the demo already runs unprivileged.
	cred *syscall.Credential
}

// unprivileged returns the user to run initdb and postgres as: the demo's
// own user, or nobody when the demo runs as root, since both programs
// refuse to run as root.
func unprivileged() (runAsUser, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Geteuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return runAsUser{name: name}, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return runAsUser{}, fmt.Errorf("initdb refuses to run as root and there is no user nobody to run it as: run the demo as an unprivileged user or set %s", EnvDatabaseURL)
	}
	uid, uerr := strconv.ParseUint(u.Uid, 10, 32)
	gid, gerr := strconv.ParseUint(u.Gid, 10, 32)
	if uerr != nil || gerr != nil {
		return runAsUser{}, fmt.Errorf("user nobody has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	return runAsUser{name: "nobody", cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

// procAttr runs a child as the user, in a process group of its own so that
// a Ctrl-C in the terminal reaches the demo, which then stops the cluster
// in order, rather than the cluster directly.
func (r runAsUser) procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: r.cred}
}

// own hands path to the user.
func (r runAsUser) own(path string) error {
	if r.cred == nil {
		return nil
	}
	return os.Chown(path, int(r.cred.Uid), int(r.cred.Gid))
}

// stopSignal asks postgres for a fast shutdown.
func stopSignal(p *os.Process) error { return p.Signal(syscall.SIGINT) }
