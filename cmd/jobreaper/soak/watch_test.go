package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/internal/fleettest"
	"github.com/jobreaper/jobreaper/reaper"
)

// passStats is what the soak reads from the daemon's own log (JSON lines
// at debug level: every pass logs its end with duration_ms, whatever it
// did): the longest pass and the longest time between the starts of two
// consecutive passes, which is the interval the daemon really kept (a
// pass longer than the interval, the leader lease statement before a pass
// and the scheduler's delays all lengthen it).
type passStats struct {
	Passes      int
	ErrorPasses int // passes that finished with errors or could not run
	// Unbalanced counts the passes that logged that their scanned tasks
	// do not add up (reaper.ScannedMismatchLog); it must stay 0.
	Unbalanced     int
	UnbalancedLine string
	// Overran counts the passes longer than soakInterval.
	Overran     int
	LongestPass time.Duration
	// LongestPassLine is the log line of the longest pass (what it
	// scanned, reaped and skipped, and when), cut to 600 bytes.
	LongestPassLine string
	LongestGap      time.Duration
	lastStart       time.Time
}

// soakDaemon is one `jobreaper run` process of the real binary whose
// log is parsed line by line as it is written (constant memory: the
// harness keeps only the end of it, without the "job skipped" lines).
type soakDaemon struct {
	*fleettest.Daemon

	mu    sync.Mutex
	stats passStats
}

// startSoakDaemon starts bin as a daemon with args (which must include
// --log-format json --log-level debug) and reads its log. It is killed at
// cleanup if still running; Stop ends it cleanly.
func startSoakDaemon(t *testing.T, bin string, args ...string) *soakDaemon {
	t.Helper()
	d := &soakDaemon{}
	d.Daemon = fleettest.StartDaemon(t, bin, fleettest.DaemonOptions{Name: "the daemon", Args: args, LogTail: 64 << 10,
		LogKeep: func(line []byte) bool { return !bytes.Contains(line, []byte(`"msg":"job skipped"`)) },
		OnLine:  d.parse})
	return d
}

func (d *soakDaemon) parse(line []byte) {
	if bytes.Contains(line, []byte(reaper.ScannedMismatchLog)) {
		d.mu.Lock()
		d.stats.Unbalanced++
		d.stats.UnbalancedLine = string(line[:min(len(line), 600)])
		d.mu.Unlock()
		return
	}
	if !bytes.Contains(line, []byte(`"duration_ms"`)) || !bytes.Contains(line, []byte(`"msg":"pass `)) {
		return
	}
	var rec struct {
		Time       time.Time `json:"time"`
		Level      string    `json:"level"`
		Msg        string    `json:"msg"`
		DurationMS int64     `json:"duration_ms"`
	}
	if json.Unmarshal(line, &rec) != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.stats
	// duration_ms is truncated to the millisecond: count the whole one.
	dur := time.Duration(rec.DurationMS+1) * time.Millisecond
	start := rec.Time.Add(-dur)
	s.Passes++
	if rec.Level == "WARN" || rec.Level == "ERROR" {
		s.ErrorPasses++
	}
	if dur > soakInterval {
		s.Overran++
	}
	if dur > s.LongestPass {
		s.LongestPass = dur
		s.LongestPassLine = string(line[:min(len(line), 600)])
	}
	if !s.lastStart.IsZero() {
		s.LongestGap = max(s.LongestGap, start.Sub(s.lastStart))
	}
	s.lastStart = start
}

func (d *soakDaemon) passStats() passStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// rssPeaks is the peak resident set size (VmRSS of /proc/<pid>/status) of
// a process in each quarter of a run of a known length, sampled every
// second: constant memory, however long the run.
type rssPeaks struct {
	Quarters [4]int64 // bytes
	Samples  int
}

// First and Last are the peaks of the first and of the last quarter.
func (p rssPeaks) First() int64 { return p.Quarters[0] }
func (p rssPeaks) Last() int64  { return p.Quarters[3] }

// sampleRSS samples pid from now for length, then returns the peaks.
// It stops early when stop is closed.
func sampleRSS(pid int, length time.Duration, stop <-chan struct{}) (rssPeaks, error) {
	var p rssPeaks
	begin := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		elapsed := time.Since(begin)
		if elapsed >= length {
			return p, nil
		}
		rss, err := vmRSS(pid)
		if err != nil {
			return p, err
		}
		p.Samples++
		quarter := min(int(4*elapsed/length), 3)
		p.Quarters[quarter] = max(p.Quarters[quarter], rss)
		select {
		case <-stop:
			return p, nil
		case <-tick.C:
		}
	}
}

// vmRSS returns VmRSS of /proc/<pid>/status in bytes.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS of %d: %q: %w", pid, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS line", pid)
}

// mib converts bytes to MiB, to one decimal.
func mib(b int64) float64 { return float64(b*10>>20) / 10 }
