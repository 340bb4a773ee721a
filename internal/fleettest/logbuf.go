package fleettest

import (
	"bytes"
	"strings"
	"sync"
)

// Log is the captured stderr of a process, line by line. It keeps every
// line, or only those Keep accepts, and of those only the last Tail bytes
// when Tail > 0 (a process that logs for an hour); it hands every complete
// line to OnLine as it is written, in order, kept or not. Offsets (Len,
// Since) count every byte kept, including those Tail dropped since. A
// last line without its newline is kept only once it is complete.
type Log struct {
	// Tail, when > 0, bounds what String returns to the last Tail bytes.
	Tail int
	// Keep, when set, says which lines to keep (all when nil).
	Keep func(line []byte) bool
	// OnLine, when set, is called with each complete line (without its
	// newline), on the goroutine that copies the process's stderr.
	OnLine func(line []byte)

	mu      sync.Mutex
	buf     []byte
	dropped int // bytes dropped from the front of buf
	partial []byte
}

// Write implements io.Writer.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, p...)
	var lines [][]byte
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := bytes.Clone(l.partial[:i])
		l.partial = l.partial[i+1:]
		lines = append(lines, line)
		if l.Keep == nil || l.Keep(line) {
			l.buf = append(append(l.buf, line...), '\n')
		}
	}
	l.partial = bytes.Clone(l.partial)
	if over := len(l.buf) - l.Tail; l.Tail > 0 && over > 0 {
		l.buf = append(l.buf[:0], l.buf[over:]...)
		l.dropped += over
	}
	onLine := l.OnLine
	l.mu.Unlock()
	if onLine != nil {
		for _, line := range lines {
			onLine(line)
		}
	}
	return len(p), nil
}

// String returns the log kept.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// Len returns how many bytes were ever kept: an offset for Since.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped + len(l.buf)
}

// Since returns what was written after offset (a Len), as far as kept.
func (l *Log) Since(offset int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := max(offset-l.dropped, 0)
	if i > len(l.buf) {
		return ""
	}
	return string(l.buf[i:])
}

// Count returns how many kept lines contain every fragment.
func (l *Log) Count(fragments ...string) int {
	n := 0
lines:
	for _, line := range strings.Split(l.String(), "\n") {
		for _, f := range fragments {
			if !strings.Contains(line, f) {
				continue lines
			}
		}
		n++
	}
	return n
}

// tailForFailure returns at most the last 30,000 bytes of the log, for a
// failed test's output.
func (l *Log) tailForFailure() string {
	s := l.String()
	if len(s) > 30000 {
		return "...\n" + s[len(s)-30000:]
	}
	return s
}
