//go:build !unix

package demo

import (
	"fmt"
	"os"
	"syscall"
)

// runAsUser is the user a throwaway cluster runs as; on this platform the
// demo starts no cluster.
type runAsUser struct{ name string }

// unprivileged reports that the throwaway cluster needs Unix.
func unprivileged() (runAsUser, error) {
	return runAsUser{}, fmt.Errorf("a throwaway PostgreSQL cluster is started on Unix only: set %s to a running server", EnvDatabaseURL)
}

func (runAsUser) procAttr() *syscall.SysProcAttr { return nil }

func (runAsUser) own(string) error { return nil }

func stopSignal(p *os.Process) error { return p.Kill() }
