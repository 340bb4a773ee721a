package reaper

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/jobreaper/jobreaper/jobs"
)

// Settings are the settings that decide what the leader does: which jobs
// it reaps, when, in which Redis it looks for their tasks, and what it
// does around a reap. The leader records them in its leader lease row;
// every replica of the same queue set compares its own with them at each
// attempt (settings drift, case B31), so that whichever replica leads,
// nobody is surprised by what it decides.
//
// Each field is one setting, compared by its JSON name (Compare): a
// setting added later is one field here, set where the daemon builds its
// Settings; the comparison and the drift log need nothing more. The JSON
// names and forms are what replicas of other versions read from the row:
// never rename one.
type Settings struct {
	Interval            string   `json:"interval"`
	HeartbeatInterval   string   `json:"heartbeat_interval"`
	DefaultStallTimeout string   `json:"stall_timeout"`
	Queues              []string `json:"queues"`
	// Cascades is a digest of the cascades (CascadesDigest): the
	// statements themselves are long, and may name product tables.
	Cascades string `json:"cascades"`
	// Redis is the Redis the daemon reads, as asynqstate.RedisID names it
	// (topology, address or master name, database; never a password).
	Redis string `json:"redis"`
	// MaxLostPerPass is max_lost_per_pass (0: no limit).
	MaxLostPerPass int `json:"max_lost_per_pass"`
	// StaleQueuedAfter is stale_queued_after, as a Go duration.
	StaleQueuedAfter string `json:"stale_queued_after"`
	// StaleQueuedLookupsPerPass is stale_queued_lookups_per_pass.
	StaleQueuedLookupsPerPass int `json:"stale_queued_lookups_per_pass"`
	// CancelOnReap is --cancel-on-reap.
	CancelOnReap bool `json:"cancel_on_reap"`
	// OutageGrace is outage_grace.
	OutageGrace bool `json:"outage_grace"`
	// MaxStalledPerPass is max_stalled_per_pass (0: no limit).
	MaxStalledPerPass int `json:"max_stalled_per_pass"`
	// MaxStalledFraction is max_stalled_fraction (0: no limit).
	MaxStalledFraction float64 `json:"max_stalled_fraction"`
	// StallStormHold is stall_storm_hold, as a Go duration ("0s": the
	// longest stall timeout among the held jobs' types).
	StallStormHold string `json:"stall_storm_hold"`
}

// NewSettings returns the Settings of a daemon's scan: durations as Go
// durations, the queues normalized like the leader lease key, the
// cascades as their digest. The caller sets the other fields (the
// daemon's wiring sets every one).
func NewSettings(interval, heartbeat, stall time.Duration, queues []string, cascades jobs.Cascades) Settings {
	q := slices.Clone(queues)
	slices.Sort(q)
	q = slices.Compact(q)
	if q == nil {
		q = []string{}
	}
	return Settings{Interval: interval.String(), HeartbeatInterval: heartbeat.String(),
		DefaultStallTimeout: stall.String(), Queues: q, Cascades: CascadesDigest(cascades)}
}

// CascadesDigest is the first 16 hex digits of the SHA-256 of the
// cascades' JSON form (types in name order): equal cascades give equal
// digests on every replica.
func CascadesDigest(c jobs.Cascades) string {
	if c == nil {
		c = jobs.Cascades{}
	}
	b, _ := json.Marshal(c) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// drift returns one "setting: ours vs leader's" line per setting that
// differs between mine and theirs.
func (mine Settings) drift(theirs Settings) []string {
	var out []string
	add := func(name, a, b string) {
		if a != b {
			out = append(out, fmt.Sprintf("%s: this replica %s, the leader %s", name, a, b))
		}
	}
	add("interval", mine.Interval, theirs.Interval)
	add("heartbeat_interval", mine.HeartbeatInterval, theirs.HeartbeatInterval)
	add("stall_timeout", mine.DefaultStallTimeout, theirs.DefaultStallTimeout)
	add("queues", fmt.Sprint(mine.Queues), fmt.Sprint(theirs.Queues))
	add("cascades (digest)", mine.Cascades, theirs.Cascades)
	return out
}

// SettingDiff is one setting whose value differs between this replica and
// the leader's record.
type SettingDiff struct {
	// Setting is the setting's JSON name: stall_timeout, redis, ...
	Setting string
	// Replica and Leader are the two values: a string as it is, any other
	// value in its JSON form (["a","b"], 100, true).
	Replica, Leader string
}

// String is the form the drift log lists: "stall_timeout: this replica
// 1h0m0s, the leader 15m0s".
func (d SettingDiff) String() string {
	return fmt.Sprintf("%s: this replica %s, the leader %s", d.Setting, d.Replica, d.Leader)
}

// Compare compares s, this replica's settings, with recorded, the settings
// object of the leader's lease row. It returns the settings whose values
// differ, in the order of Settings' fields, and, as unknown, the names of
// those the record lacks: a leader of an older version (a rolling upgrade)
// does not record settings added since, and what it does not record is
// not a difference. A setting the record holds and s lacks (a newer
// leader's) is ignored likewise. Values are compared as JSON values, so
// the row's jsonb formatting does not matter. The error says that recorded
// is not a JSON object.
func (s Settings) Compare(recorded json.RawMessage) (diffs []SettingDiff, unknown []string, err error) {
	var theirs map[string]json.RawMessage
	if err := json.Unmarshal(recorded, &theirs); err != nil || theirs == nil {
		return nil, nil, fmt.Errorf("the leader's recorded settings %.200q are not a JSON object", recorded)
	}
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		raw, ok := theirs[name]
		if !ok {
			unknown = append(unknown, name)
			continue
		}
		var leader any
		if err := json.Unmarshal(raw, &leader); err != nil {
			return nil, nil, fmt.Errorf("the leader's recorded %s %.200q is not a JSON value", name, raw)
		}
		mine := jsonValue(v.Field(i).Interface())
		if reflect.DeepEqual(mine, leader) {
			continue
		}
		d := SettingDiff{Setting: name, Replica: showValue(mine), Leader: showValue(leader)}
		if _, isString := leader.(string); d.Replica == d.Leader || isString != (reflect.TypeOf(mine) == reflect.TypeOf("")) {
			// Values of two JSON types (a version that changed a
			// setting's form): both in JSON, so the log tells them apart.
			d.Replica, d.Leader = string(jsonForm(mine)), string(jsonForm(leader))
		}
		diffs = append(diffs, d)
	}
	return diffs, unknown, nil
}

// jsonValue is v as encoding/json decodes its JSON form into an any, so
// that it compares with a value read from the row.
func jsonValue(v any) any {
	b, _ := json.Marshal(v) // Settings' fields are strings, numbers, booleans and string slices
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// showValue is a setting's value as the drift log prints it.
func showValue(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return string(jsonForm(v))
}

// jsonForm is v's JSON form.
func jsonForm(v any) []byte {
	b, _ := json.Marshal(v) // decoded from JSON: always marshals
	return b
}
