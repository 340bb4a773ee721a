package fleettest

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// WorkerOptions describe one worker process (package
// internal/fleettest/worker; its doc comment lists the job kinds and the
// lines it says).
type WorkerOptions struct {
	// Name is the worker name its guard claims with, and names the
	// process in failures.
	Name string
	// DatabaseURL and RedisURL go through relays of the worker's own
	// (Worker.PG, Worker.Redis); Schema is jobreaper's schema.
	DatabaseURL, Schema, RedisURL string
	// Queue is the asynq queue it serves, or several, comma-separated.
	Queue string
	// DefaultName: the guard claims with its default name,
	// "<host>:<pid>" of the process, instead of Name (which then only
	// names the process in failures).
	DefaultName bool
	// Args are more flags: --kind, --heartbeat-every, --run-for,
	// --hang-after, --code, --heartbeat-interval, --concurrency,
	// --retry-delay, --shutdown-timeout.
	Args []string
}

// Worker is a running worker process.
type Worker struct {
	Name string
	// PG and Redis are the worker's own relays: cut one to take that
	// server away from this worker only.
	PG, Redis *Relay
	// Log is its stderr.
	Log *Log

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}

	mu   sync.Mutex
	said []string
}

// StartWorker starts bin (BuildWorker's) and waits until it serves its
// queue (it said "ready"). It is killed at t's cleanup, and what it said
// and logged is shown when t failed.
func StartWorker(t testing.TB, bin string, o WorkerOptions) *Worker {
	t.Helper()
	w := &Worker{Name: o.Name, Log: &Log{}, exited: make(chan struct{})}
	if w.Name == "" {
		w.Name = "worker"
	}
	var dbURL, redisURL string
	w.PG, dbURL = RelayURL(t, o.DatabaseURL)
	w.Redis, redisURL = RelayURL(t, o.RedisURL)
	name := w.Name
	if o.DefaultName {
		name = ""
	}
	w.cmd = exec.Command(bin, append([]string{"--database-url", dbURL, "--schema", o.Schema, "--redis-url", redisURL,
		"--queue", o.Queue, "--name", name}, o.Args...)...)
	w.cmd.Stderr = w.Log
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", w.Name, err)
	}
	go func() {
		defer close(w.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.mu.Lock()
			w.said = append(w.said, sc.Text())
			w.mu.Unlock()
		}
		_ = w.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = w.stdin.Close()
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.exited
		if t.Failed() {
			t.Logf("%s said:\n%s\nits log:\n%s", w.Name, strings.Join(w.Said(), "\n"), w.Log.tailForFailure())
		}
	})
	w.Await(t, "ready ")
	return w
}

// Said returns every line the worker said so far.
func (w *Worker) Said() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.said...)
}

// Await waits until the worker has said a line starting with prefix (at
// any time since its start) and returns it. It fails t when the worker
// exits first or after Deadline.
func (w *Worker) Await(t testing.TB, prefix string) string {
	t.Helper()
	var found string
	WaitFor(t, w.Name+" says "+prefix+"...", func() bool {
		for _, line := range w.Said() {
			if strings.HasPrefix(line, prefix) {
				found = line
				return true
			}
		}
		select {
		case <-w.exited:
			t.Fatalf("%s exited (%s) while the test waited for it to say %q", w.Name, w.cmd.ProcessState, prefix)
		default:
		}
		return false
	})
	return found
}

// Count returns how many lines the worker said so far start with prefix
// (how often a job started: "start J-1 ").
func (w *Worker) Count(prefix string) int {
	n := 0
	for _, line := range w.Said() {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// Tell sends the worker a command ("hang J-1", "finish all", "go J-2": the
// worker program's doc comment lists them), waits until the worker says it
// applied it, and returns to how many running handlers. It fails t when
// the worker refused the command, exits first, or after Deadline.
func (w *Worker) Tell(t testing.TB, command string) int {
	t.Helper()
	from := len(w.Said())
	if _, err := fmt.Fprintln(w.stdin, command); err != nil {
		t.Fatalf("telling %s %q: %v", w.Name, command, err)
	}
	prefix := "did " + command + ": "
	var answer string
	WaitFor(t, w.Name+" applies "+command, func() bool {
		for _, line := range w.Said()[from:] {
			if strings.HasPrefix(line, prefix) {
				answer = strings.TrimPrefix(line, prefix)
				return true
			}
		}
		select {
		case <-w.exited:
			t.Fatalf("%s exited (%s) while the test waited for it to apply %q", w.Name, w.cmd.ProcessState, command)
		default:
		}
		return false
	})
	n, err := strconv.Atoi(strings.TrimSuffix(answer, " handler(s)"))
	if err != nil {
		t.Fatalf("%s refused %q: %s", w.Name, command, answer)
	}
	return n
}

// Signal sends sig to the worker.
func (w *Worker) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signalling %s with %s: %v", w.Name, sig, err)
	}
}

// Stop sends SIGTERM and returns the exit code (see Wait).
func (w *Worker) Stop(t testing.TB) int {
	t.Helper()
	w.Signal(t, syscall.SIGTERM)
	return w.Wait(t)
}

// Wait waits up to Deadline for the process to exit and returns its exit
// code (-1 when a signal ended it, as SIGKILL does).
func (w *Worker) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-w.exited:
		return w.cmd.ProcessState.ExitCode()
	case <-time.After(Deadline):
		t.Fatalf("%s did not exit within %s", w.Name, Deadline)
		return -1
	}
}
