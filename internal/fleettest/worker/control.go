package main

import (
	"fmt"
	"strings"
	"sync"
)

// trigger is a channel closed once, by the first command that names it.
type trigger struct {
	once sync.Once
	c    chan struct{}
}

func newTrigger() *trigger { return &trigger{c: make(chan struct{})} }

func (s *trigger) fire() { s.once.Do(func() { close(s.c) }) }

// control is what the commands can tell one running handler.
type control struct {
	jobID              string
	hang, finish, goOn *trigger
}

// registry holds the running handlers, for the commands on stdin.
type registry struct {
	mu      sync.Mutex
	running map[*control]bool
}

func newRegistry() *registry { return &registry{running: map[*control]bool{}} }

// add registers a handler of jobID until remove.
func (r *registry) add(jobID string) *control {
	c := &control{jobID: jobID, hang: newTrigger(), finish: newTrigger(), goOn: newTrigger()}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[c] = true
	return c
}

func (r *registry) remove(c *control) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running, c)
}

// command applies line ("hang|finish|go <job id>|all") to the handlers
// running now and returns how many it named. It fails on any other line.
func (r *registry) command(line string) (int, error) {
	verb, target, ok := strings.Cut(line, " ")
	if !ok || target == "" {
		return 0, fmt.Errorf("want a command and a job ID or all, as in %q", "hang J-1")
	}
	pick := map[string]func(*control) *trigger{
		"hang":   func(c *control) *trigger { return c.hang },
		"finish": func(c *control) *trigger { return c.finish },
		"go":     func(c *control) *trigger { return c.goOn },
	}[verb]
	if pick == nil {
		return 0, fmt.Errorf("unknown command %q: want hang, finish or go", verb)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for c := range r.running {
		if target == "all" || c.jobID == target {
			pick(c).fire()
			n++
		}
	}
	return n, nil
}
