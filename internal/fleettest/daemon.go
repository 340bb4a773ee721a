package fleettest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/failpoint"
)

// DaemonOptions describe one `jobreaper run` process.
type DaemonOptions struct {
	// Name names the process in failures and logs ("replica A").
	Name string
	// DatabaseURL and RedisURL, when set, are passed as --database-url and
	// --redis-url through relays of the daemon's own (Daemon.PG,
	// Daemon.Redis).
	DatabaseURL, RedisURL string
	// Args follow `run --metrics-addr 127.0.0.1:0 --status-addr
	// 127.0.0.1:0 --start-jitter 0s` and
	// the URLs; a later flag overrides an earlier one.
	Args []string
	// Failpoints is JOBREAPER_FAILPOINTS for this process only (see
	// package internal/failpoint; the binary must be BuildJobreaper's).
	Failpoints string
	// Env is added to the test's environment.
	Env []string
	// LogTail, LogKeep and OnLine configure the captured log (Log's Tail,
	// Keep and OnLine).
	LogTail int
	LogKeep func(line []byte) bool
	OnLine  func(line []byte)
}

// Daemon is a running `jobreaper run` of the real binary.
type Daemon struct {
	Name string
	// PG and Redis are the daemon's own relays (nil when the URL was not
	// given): cut one to take that server away from this daemon only.
	PG, Redis *Relay
	// Log is its stderr.
	Log *Log
	// Addr is its metrics server's address.
	Addr string
	// StatusAddr is its status page's address, once it listens (see
	// StatusPageAddr).
	StatusAddr string

	cmd    *exec.Cmd
	exited chan struct{}
}

// metricsAddrRE finds the metrics server's address in the daemon's log,
// text or JSON.
var metricsAddrRE = regexp.MustCompile(`serving /metrics and /healthz.*?"?addr"?[=:]"?([0-9.]+:[0-9]+)`)

// statusAddrRE finds the status page's address in the daemon's log.
var statusAddrRE = regexp.MustCompile(`serving the status page.*?"?addr"?[=:]"?([0-9.]+:[0-9]+)`)

// StartDaemon starts bin as `jobreaper run` with a metrics server on a
// free port and no start jitter, and waits until the server listens. The
// process is killed at t's cleanup if still running, and its log shown
// when t failed.
func StartDaemon(t testing.TB, bin string, o DaemonOptions) *Daemon {
	t.Helper()
	d := &Daemon{Name: o.Name, Log: &Log{Tail: o.LogTail, Keep: o.LogKeep, OnLine: o.OnLine}, exited: make(chan struct{})}
	if d.Name == "" {
		d.Name = "daemon"
	}
	// The status page on a free port too: several daemons run at once.
	args := []string{"run", "--metrics-addr", "127.0.0.1:0", "--status-addr", "127.0.0.1:0", "--start-jitter", "0s"}
	if o.DatabaseURL != "" {
		var url string
		d.PG, url = RelayURL(t, o.DatabaseURL)
		args = append(args, "--database-url", url)
	}
	if o.RedisURL != "" {
		var url string
		d.Redis, url = RelayURL(t, o.RedisURL)
		args = append(args, "--redis-url", url)
	}
	d.cmd = exec.Command(bin, append(args, o.Args...)...)
	d.cmd.Env = append(append(os.Environ(), o.Env...), failpoint.Env+"="+o.Failpoints)
	d.cmd.Stderr = d.Log
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", d.Name, err)
	}
	go func() {
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGCONT)
		_ = d.cmd.Process.Kill()
		<-d.exited
		if t.Failed() {
			t.Logf("%s's log:\n%s", d.Name, d.Log.tailForFailure())
		}
	})
	WaitFor(t, d.Name+"'s metrics server listens", func() bool {
		if m := metricsAddrRE.FindStringSubmatch(d.Log.String()); m != nil {
			d.Addr = m[1]
			return true
		}
		if d.Exited() {
			t.Fatalf("%s exited with %d before its metrics server listened:\n%s", d.Name, d.ExitCode(), d.Log.tailForFailure())
		}
		return false
	})
	return d
}

// Pid is the daemon's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Metric returns the sum of the series of name whose labels contain every
// fragment, from one scrape; -1 when nothing answered (a stopped or
// exited process).
func (d *Daemon) Metric(name string, fragments ...string) float64 {
	v, ok := Metric(d.Addr, name, fragments...)
	if !ok {
		return -1
	}
	return v
}

// Leads reports whether the daemon exports jobreaper_leader 1.
func (d *Daemon) Leads() bool { return d.Metric("jobreaper_leader") == 1 }

// Probe returns the status code and body of GET path (0 when nothing
// answered).
func (d *Daemon) Probe(path string) (int, string) { return Probe(d.Addr, path) }

// Signal sends sig to the daemon.
func (d *Daemon) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling %s with %s: %v", d.Name, sig, err)
	}
}

// Exited reports whether the process has exited.
func (d *Daemon) Exited() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// ExitCode is the process's exit code once it exited (-1 when a signal
// ended it, or while it runs).
func (d *Daemon) ExitCode() int {
	if !d.Exited() {
		return -1
	}
	return d.cmd.ProcessState.ExitCode()
}

// Wait waits up to Deadline for the process to exit and returns its exit
// code (-1 when a signal ended it).
func (d *Daemon) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-d.exited:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(Deadline):
		t.Fatalf("%s did not exit within %s", d.Name, Deadline)
		return -1
	}
}

// Stop sends SIGTERM and returns the exit code (see Wait).
func (d *Daemon) Stop(t testing.TB) int {
	t.Helper()
	d.Signal(t, syscall.SIGTERM)
	return d.Wait(t)
}

// AwaitLog waits until a line written after offset (a d.Log.Len()) holds
// every fragment, and returns the log's length then, an offset for the
// next wait.
func (d *Daemon) AwaitLog(t testing.TB, offset int, fragments ...string) int {
	t.Helper()
	var end int
	WaitFor(t, d.Name+" logs a line with "+strings.Join(fragments, ", "), func() bool {
		end = d.Log.Len()
		for _, line := range strings.Split(d.Log.Since(offset), "\n") {
			if containsAll(line, fragments) {
				return true
			}
		}
		return false
	})
	return end
}

func containsAll(s string, fragments []string) bool {
	for _, f := range fragments {
		if !strings.Contains(s, f) {
			return false
		}
	}
	return true
}

// WaitFor polls cond until it holds, failing t after Deadline with what it
// waited for.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", Deadline, what)
		}
		time.Sleep(pollEvery) // polling
	}
}

// Result is what one run of a command left behind.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs bin with args to its end (a `run --once`, a `migrate`), with
// env added to the test's environment and JOBREAPER_FAILPOINTS set to
// failpoints, and returns its exit code and output.
func Run(t testing.TB, bin, failpoints string, env []string, args ...string) Result {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Env = append(append(os.Environ(), env...), failpoint.Env+"="+failpoints)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var exit *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &exit) {
		t.Fatalf("running %s: %v", bin, err)
	}
	return Result{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}
}

// StatusPageAddr waits until d's status page listens and returns its
// address (the daemon starts it right after its metrics server).
func (d *Daemon) StatusPageAddr(t testing.TB) string {
	t.Helper()
	WaitFor(t, d.Name+"'s status page listens", func() bool {
		if m := statusAddrRE.FindStringSubmatch(d.Log.String()); m != nil {
			d.StatusAddr = m[1]
			return true
		}
		if d.Exited() {
			t.Fatalf("%s exited with %d before its status page listened:\n%s", d.Name, d.ExitCode(), d.Log.tailForFailure())
		}
		return false
	})
	return d.StatusAddr
}
