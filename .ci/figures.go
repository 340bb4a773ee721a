//go:build ignore

// figures prints the reliability report: one markdown table built from the
// figures.jsonl that jobstest.Figure writes (one JSON object a line:
// {"suite", "test", "name", "value"}), then one line naming the machine.
//
//	go run .ci/figures.go [-postgres VERSION] [-redis VERSION] FILE
//
// Numbers of the same suite and name are summed over the tests that
// recorded them (interleavings, faults, jobs, inputs, violations, rows
// lost, live jobs reaped), except the percentiles, maxima and memory
// figures (names holding p50, p99, max or rss), of which the largest is
// shown: a sum of two p99s means nothing. Strings (seeds) are listed,
// each once. A suite without figures reads "not run". It exits 1 when any
// suite counted an invariant violation, a lost row or a live job reaped
// by a blip (the blip suite's live_reaped), or when a line of FILE cannot
// be read (a dropped line could hide one); 2 when FILE cannot be opened.
//
// It is a single file run with go run, kept out of the module's packages
// (the .ci directory is ignored by ./...), so that the report needs
// nothing but Go on a fresh machine.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// figure is one line of figures.jsonl.
type figure struct {
	Suite string `json:"suite"`
	Test  string `json:"test"`
	Name  string `json:"name"`
	Value any    `json:"value"`
}

// totals holds the aggregated figures of one suite.
type totals struct {
	numbers map[string]float64
	strings map[string][]string
}

type report struct {
	suites map[string]*totals
	bad    []string // lines that could not be read
}

func main() {
	pg := flag.String("postgres", "unknown", "PostgreSQL server version, for the machine line")
	redis := flag.String("redis", "unknown", "Redis server version, for the machine line")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: go run .ci/figures.go [-postgres VERSION] [-redis VERSION] FILE")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil && !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "figures: %v\n", err)
		os.Exit(2)
	}
	var r *report
	if f == nil { // no test recorded anything: every suite reads "not run"
		r = read(strings.NewReader(""))
	} else {
		r = read(f)
		f.Close()
	}
	failed := r.print(os.Stdout)
	fmt.Printf("\nMachine: %s.\n", machine(*pg, *redis))
	for _, b := range r.bad {
		fmt.Fprintf(os.Stderr, "figures: unreadable line: %s\n", b)
	}
	if failed || len(r.bad) > 0 {
		os.Exit(1)
	}
}

// read aggregates every line of in.
func read(in io.Reader) *report {
	r := &report{suites: map[string]*totals{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var fg figure
		if err := json.Unmarshal([]byte(line), &fg); err != nil || fg.Suite == "" || fg.Name == "" {
			r.bad = append(r.bad, fmt.Sprintf("%d: %q", n, line))
			continue
		}
		t := r.suites[fg.Suite]
		if t == nil {
			t = &totals{numbers: map[string]float64{}, strings: map[string][]string{}}
			r.suites[fg.Suite] = t
		}
		switch v := fg.Value.(type) {
		case float64:
			if keepsLargest(fg.Name) {
				if old, ok := t.numbers[fg.Name]; !ok || v > old {
					t.numbers[fg.Name] = v
				}
			} else {
				t.numbers[fg.Name] += v
			}
		case string:
			if !slices.Contains(t.strings[fg.Name], v) {
				t.strings[fg.Name] = append(t.strings[fg.Name], v)
			}
		default:
			r.bad = append(r.bad, fmt.Sprintf("%d: value of %s/%s is neither a number nor a string: %q", n, fg.Suite, fg.Name, line))
		}
	}
	if err := sc.Err(); err != nil {
		r.bad = append(r.bad, err.Error())
	}
	return r
}

// keepsLargest reports whether figures named name are shown as their
// largest value rather than their sum.
func keepsLargest(name string) bool {
	return strings.Contains(name, "p50") || strings.Contains(name, "p99") || strings.Contains(name, "max") ||
		strings.Contains(name, "rss")
}

// The suites of the report, in its order.
var suiteOrder = []string{"race", "faults", "soak", "blip", "fleet", "badinput"}

// number returns the figure as text ("not run" when its suite recorded
// nothing, "-" when the suite ran without it).
func (r *report) number(suite, name string, unit string) string {
	t := r.suites[suite]
	if t == nil {
		return "not run"
	}
	v, ok := t.numbers[name]
	if !ok {
		return "-"
	}
	return format(v) + unit
}

func format(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// print writes the table and reports whether a violation, a lost row or
// a live job reaped by a blip was counted.
func (r *report) print(w io.Writer) (failed bool) {
	row := func(figure, value string) { fmt.Fprintf(w, "| %s | %s |\n", figure, value) }
	fmt.Fprintln(w, "| figure | value |")
	fmt.Fprintln(w, "|---|---|")
	row("race: interleavings run", r.number("race", "interleavings", ""))
	for _, kind := range []struct{ name, label string }{
		{"pg_cut", "PostgreSQL connections cut"}, {"redis_stop", "Redis stopped"},
		{"reaper_sigkill", "reaper killed (SIGKILL)"}, {"worker_sigkill", "worker killed (SIGKILL)"},
	} {
		row("faults: "+kind.label, r.number("faults", kind.name, ""))
	}
	row("soak: duration", r.number("soak", "duration_s", " s"))
	row("soak: jobs enqueued / completed / reaped / failed by their handler", strings.Join([]string{
		r.number("soak", "jobs_enqueued", ""), r.number("soak", "jobs_completed", ""), r.number("soak", "jobs_reaped", ""),
		r.number("soak", "jobs_failed", "")}, " / "))
	row("soak: reap delay p50 / p99", r.number("soak", "reap_delay_p50_ms", " ms")+" / "+r.number("soak", "reap_delay_p99_ms", " ms"))
	row("soak: reaper RSS first / last quarter", r.number("soak", "rss_first_quarter_mib", " MiB")+" / "+r.number("soak", "rss_last_quarter_mib", " MiB"))
	row("blip: stall-storm jobs held / reaped together after the hold", r.number("blip", "storm_jobs_held", "")+" / "+
		r.number("blip", "storm_jobs_reaped_after_hold", ""))
	row("blip: hold end to reap / release-hold to reap", r.number("blip", "hold_end_to_reap_max_ms", " ms")+" / "+
		r.number("blip", "release_to_reap_max_ms", " ms"))
	row("blip: PostgreSQL restart downtime / live jobs through it", r.number("blip", "restart_downtime_s", " s")+" / "+
		r.number("blip", "restart_live_jobs", ""))
	r.fleetRows(row)
	row("bad input: inputs tried", r.number("badinput", "inputs", ""))

	var violations, lost float64
	var perSuite, perSuiteLost []string
	for _, s := range r.suiteNames() {
		t := r.suites[s]
		if v, ok := t.numbers["violations"]; ok {
			violations += v
			perSuite = append(perSuite, s+" "+format(v))
		} else {
			perSuite = append(perSuite, s+" -")
		}
		if lo, ok := t.numbers["rows_lost"]; ok {
			lost += lo
			perSuiteLost = append(perSuiteLost, s+" "+format(lo))
		}
	}
	verdict := func(total float64, parts []string) string {
		if len(parts) == 0 {
			return "not run"
		}
		s := format(total) + " (" + strings.Join(parts, ", ") + ")"
		if total != 0 {
			s = "**" + s + ": must be 0**"
		}
		return s
	}
	row("invariant violations (must be 0)", verdict(violations, perSuite))
	row("rows lost (must be 0)", verdict(lost, perSuiteLost))
	liveReaped, blipRan := 0.0, false
	if t := r.suites["blip"]; t != nil {
		liveReaped, blipRan = t.numbers["live_reaped"]
	}
	if blipRan {
		row("blip: live jobs reaped (must be 0)", verdict(liveReaped, []string{"blip " + format(liveReaped)}))
	} else {
		row("blip: live jobs reaped (must be 0)", r.number("blip", "live_reaped", ""))
	}
	fleetBad := 0.0
	for _, name := range []struct{ figure, label string }{
		{"false_reaps", "fleet: false reaps (must be 0)"}, {"double_effects", "fleet: double effects (must be 0)"},
	} {
		v, ran := 0.0, false
		if t := r.suites["fleet"]; t != nil {
			v, ran = t.numbers[name.figure]
		}
		if ran {
			row(name.label, verdict(v, []string{"fleet " + format(v)}))
			fleetBad += v
		} else {
			row(name.label, r.number("fleet", name.figure, ""))
		}
	}

	var seeds []string
	for _, s := range r.suiteNames() {
		for _, v := range r.suites[s].strings["seed"] {
			seeds = append(seeds, s+" "+v)
		}
	}
	if len(seeds) == 0 {
		seeds = []string{"none recorded"}
	}
	row("seeds", strings.Join(seeds, ", "))
	return violations != 0 || lost != 0 || liveReaped != 0 || fleetBad != 0
}

// fleetKinds and fleetFaults are the fleet suite's job and fault kinds,
// in the report's order, with their labels.
var (
	fleetKinds  = []string{"normal", "retried", "failing", "stalling", "late", "slow"}
	fleetFaults = []struct{ name, label string }{
		{"leader_sigkill", "leader killed"}, {"leader_sigstop", "leader stopped"}, {"leader_pg_cut", "leader cut"},
		{"workers_pg_cut", "workers cut"}, {"pg_restart", "PostgreSQL restarted"}, {"redis_restart", "Redis restarted"},
		{"worker_sigkill", "worker killed"}, {"sentinel_failover", "Sentinel failover"},
	}
	fleetBroken = []string{"brokenfence", "brokengrace", "brokenstorm", "brokenhbretry"}
)

// fleetRows writes the fleet suite's rows (its verdicts are with the
// others').
func (r *report) fleetRows(row func(figure, value string)) {
	join := func(names []string, prefix, unit string) string {
		parts := make([]string, len(names))
		for i, n := range names {
			parts[i] = r.number("fleet", prefix+n, unit)
		}
		return strings.Join(parts, " / ")
	}
	row("fleet: duration", r.number("fleet", "duration_s", " s"))
	row("fleet: jobs "+strings.Join(fleetKinds, " / "), join(fleetKinds, "jobs_", ""))
	var labels, names []string
	for _, f := range fleetFaults {
		labels, names = append(labels, f.label), append(names, f.name)
	}
	row("fleet: faults "+strings.Join(labels, " / "), join(names, "faults_", ""))
	row("fleet: takeovers / time p50 / max", r.number("fleet", "takeovers", "")+" / "+r.number("fleet", "takeover_p50_ms", " ms")+
		" / "+r.number("fleet", "takeover_max_ms", " ms"))
	row("fleet: reaps of killed workers' attempts (counted apart)", r.number("fleet", "killed_reaps", ""))
	for _, k := range []string{"stalling", "late"} {
		row("fleet: reap delay p50 / p99, "+k, r.number("fleet", "reap_delay_p50_ms_"+k, " ms")+" / "+
			r.number("fleet", "reap_delay_p99_ms_"+k, " ms"))
	}
	row("fleet: daemons' RSS first / last quarter", r.number("fleet", "rss_first_quarter_mib", " MiB")+" / "+
		r.number("fleet", "rss_last_quarter_mib", " MiB"))
	row("fleet: broken builds caught (violations) "+strings.Join(fleetBroken, " / "), join(fleetBroken, "broken_caught_", ""))
}

// suiteNames lists the suites that recorded figures: the known ones in
// the report's order, then any other, sorted.
func (r *report) suiteNames() []string {
	var out []string
	for s := range r.suites {
		out = append(out, s)
	}
	rank := func(s string) int {
		if i := slices.Index(suiteOrder, s); i >= 0 {
			return i
		}
		return len(suiteOrder)
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b)) })
	return out
}

// machine describes this machine: cores, memory, Go and the services'
// versions.
func machine(pg, redis string) string {
	mem := "unknown memory"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	return fmt.Sprintf("%d cores, %s, %s %s/%s, PostgreSQL %s, Redis %s",
		runtime.NumCPU(), mem, runtime.Version(), runtime.GOOS, runtime.GOARCH, pg, redis)
}
