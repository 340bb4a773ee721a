//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled is true in a failpoints build: Inject reads JOBREAPER_FAILPOINTS.
const Enabled = true

// action is what one point does when reached.
type action struct {
	text  string // as written, for the "reached" line
	kind  string // panic, sleep or stop
	sleep time.Duration
}

// actions parses JOBREAPER_FAILPOINTS once. A value it cannot read stops
// the process with exit code 2 and a line naming the entry: a test with a
// misspelt failpoint must not pass by accident.
var actions = sync.OnceValue(func() map[string]action {
	out := map[string]action{}
	raw := os.Getenv(Env)
	for _, entry := range strings.Split(raw, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, text, ok := strings.Cut(entry, "=")
		if !ok || name == "" {
			die(raw, entry, "want name=action")
		}
		a := action{text: text}
		switch kind, arg, _ := strings.Cut(text, ":"); kind {
		case "panic", "stop":
			if arg != "" {
				die(raw, entry, kind+" takes no argument")
			}
			a.kind = kind
		case "sleep":
			d, err := time.ParseDuration(arg)
			if err != nil || d <= 0 {
				die(raw, entry, "sleep wants a positive Go duration, such as sleep:2s")
			}
			a.kind, a.sleep = kind, d
		default:
			die(raw, entry, "the action is one of panic, sleep:<duration>, stop")
		}
		out[name] = a
	}
	return out
})

func die(raw, entry, rule string) {
	fmt.Fprintf(os.Stderr, "%s=%q: entry %q: %s\n", Env, raw, entry, rule)
	os.Exit(2)
}

// Inject takes the action JOBREAPER_FAILPOINTS names for the point name,
// after writing "failpoint <name> reached (<action>)" to stderr; a point
// the variable does not name does nothing.
func Inject(name string) {
	a, ok := actions()[name]
	if !ok {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s reached (%s)\n", name, a.text)
	switch a.kind {
	case "panic":
		panic("failpoint " + name + ": injected panic")
	case "sleep":
		time.Sleep(a.sleep)
	case "stop":
		stop()
	}
}

// stop stops the whole process until a SIGCONT, before the calling
// goroutine goes on. The signal is sent to the calling thread, which
// takes it on its way back from the system call: sent to the process
// (kill), the kernel hands it to whichever thread it picks, and this one
// could run on, for example send a COMMIT, before the stop reached it.
func stop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
