package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// OriginKind is the kind of source a setting's value came from.
type OriginKind int

// Kinds of Origin, lowest precedence first.
const (
	// OriginDefault: no source set the value; it is the default.
	OriginDefault OriginKind = iota
	// OriginFile: a key of the YAML file.
	OriginFile
	// OriginEnv: a JOBREAPER_ environment variable.
	OriginEnv
	// OriginFlag: a flag given on the command line.
	OriginFlag
)

// Origin says where the value of one setting came from, so that an error
// can say what to fix.
type Origin struct {
	// Kind is the source.
	Kind OriginKind
	// Key is the setting's YAML key, e.g. "stall_timeout".
	Key string
	// Name is the flag ("--stall-timeout"), the environment variable
	// ("JOBREAPER_STALL_TIMEOUT") or the file's path; "" for the default.
	Name string
	// Line is the key's line in the file (OriginFile); 0 when unknown.
	Line int
}

// String names the source as an operator writes it: "flag --interval",
// "environment JOBREAPER_INTERVAL", "file /etc/jobreaper.yaml line 4 key
// interval", or "default".
func (o Origin) String() string {
	switch o.Kind {
	case OriginFlag:
		return "flag " + o.Name
	case OriginEnv:
		return "environment " + o.Name
	case OriginFile:
		if o.Line > 0 {
			return fmt.Sprintf("file %s line %d key %s", o.Name, o.Line, o.Key)
		}
		return fmt.Sprintf("file %s key %s", o.Name, o.Key)
	default:
		return "default"
	}
}

// Origins holds the Origin of each setting that a source set, by YAML key;
// a key it does not hold has its default.
type Origins map[string]Origin

// Of returns the origin of key. A cascade's key (cascades["<type>"] and
// what follows) has the origin of cascades.
func (o Origins) Of(key string) Origin {
	if got, ok := o[key]; ok {
		return got
	}
	if i := strings.IndexByte(key, '['); i > 0 {
		if got, ok := o[key[:i]]; ok {
			return got
		}
	}
	return Origin{Kind: OriginDefault, Key: key}
}

// Annotate sets the Source of every *FieldError joined in err that has
// none, from the origins of its Key and Related settings, and returns err.
// Source stays empty when every one of them holds its default: the
// message itself then says how to set the value.
func (o Origins) Annotate(err error) error {
	for _, fe := range fieldErrors(err) {
		if fe.Source == "" && !fe.unknownKey { // an unknown key's message names its file and line
			fe.Source = o.source(fe)
		}
	}
	return err
}

func (o Origins) source(fe *FieldError) string {
	keys := append([]string{fe.Key}, fe.Related...)
	anySet := false
	for _, k := range keys {
		if o.Of(k).Kind != OriginDefault {
			anySet = true
		}
	}
	if !anySet {
		return ""
	}
	if len(keys) == 1 {
		return "from " + o.Of(fe.Key).String()
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if origin := o.Of(k); origin.Kind == OriginDefault {
			parts = append(parts, k+" is the default")
		} else {
			parts = append(parts, k+" from "+origin.String())
		}
	}
	return strings.Join(parts, ", ")
}

// fieldErrors returns every *FieldError joined in err.
func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe)
		}
	}
	walk(err)
	return out
}

// MigrateKeys are the settings `jobreaper migrate` checks: it connects to
// PostgreSQL, migrates one schema and logs. Pass them to Only so that a
// daemon-only setting (redis_url, queues, the stall rule, metrics_addr,
// cascades, ...) cannot stop a migration.
var MigrateKeys = []string{"database_url", "schema", "op_timeout", "log_level", "log_format"}

// RequeueKeys are the settings `jobreaper requeue` uses: PostgreSQL and
// Redis, the queues and the age of --stale, the log settings, and the
// cascades (a requeue runs the type's on_requeued cascade). Pass them to
// Only so that a daemon-only setting cannot stop an operator's requeue.
var RequeueKeys = []string{"database_url", "redis_url", "redis_ca_file", "redis_tls_server_name", "schema", "op_timeout", "log_level", "log_format",
	"queues", "stale_queued_after", "cascades"}

// ReleaseHoldKeys are the settings `jobreaper release-hold` uses: like
// migrate, it contacts only PostgreSQL; queues selects the holds it ends.
var ReleaseHoldKeys = append(append([]string{}, MigrateKeys...), "queues")

// PruneKeys are the settings `jobreaper prune` uses: like migrate, it
// contacts only PostgreSQL.
var PruneKeys = MigrateKeys

// RunOnceKeys are the settings whose problems stop `jobreaper run --once`:
// every setting but marker_check_window. The window paces the daemon's
// re-assertion of markers, a slice per pass, so its rule (at least
// interval) is the daemon's; a manual pass re-asserts every marker of the
// last 7 days at once and never reads it.
var RunOnceKeys = slices.DeleteFunc(knownKeys(), func(k string) bool { return k == "marker_check_window" })

// InspectKeys are the settings `jobreaper inspect` uses: PostgreSQL for the
// record, Redis for the marker and asynq's task state.
var InspectKeys = []string{"database_url", "redis_url", "redis_ca_file", "redis_tls_server_name", "schema", "op_timeout", "log_level", "log_format"}

// CancelKeys are the settings `jobreaper cancel` uses: inspect's, and the
// cascades (a cancel runs the type's on_failed cascade).
var CancelKeys = append(append([]string{}, InspectKeys...), "cascades")

// Only returns err without the *FieldErrors about settings other than keys
// (a cascade's problems count as cascades'). It keeps every error that is
// not a *FieldError (an unreadable file) and every unknown key of the file,
// since a misspelt key may be one of keys: "shema: jr" would otherwise
// migrate the wrong schema. It returns nil when nothing is left.
func Only(err error, keys ...string) error {
	var kept []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *FieldError
		if !errors.As(e, &fe) || fe.unknownKey || keyIn(fe.Key, keys) {
			kept = append(kept, e)
		}
	}
	if err != nil {
		walk(err)
	}
	return errors.Join(kept...)
}

func keyIn(key string, keys []string) bool {
	for _, k := range keys {
		if key == k || strings.HasPrefix(key, k+"[") {
			return true
		}
	}
	return false
}

// SuggestLimitsKeys are the settings `jobreaper suggest-limits` uses: like
// migrate, it contacts only PostgreSQL; the stall rule's settings give the
// default stall timeout of types without one and the rule's minimum.
var SuggestLimitsKeys = append(append([]string{}, MigrateKeys...), "interval", "heartbeat_interval", "stall_timeout")
