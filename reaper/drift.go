package reaper

import (
	"strings"
	"time"

	"github.com/jobreaper/jobreaper/internal/pgstore"
)

// driftLogRepeat is how often a settings drift that lasts is logged
// again. A change of its differences is logged at once; every attempt
// (Interval/3) would bury the log, and once per ten minutes keeps it in
// any log window an operator looks at.
const driftLogRepeat = 10 * time.Minute

// driftState is what the settings drift check last found and said.
type driftState struct {
	drifted bool
	// said lists the differences last logged, at (by LeaderLease.now);
	// empty when none are.
	said string
	at   time.Time
	// unknown lists the settings the leader's record lacked at the last
	// comparison, as last logged.
	unknown string
}

// compareSettings checks the holder's recorded settings against this
// daemon's (B31): the differences are logged as an error naming each
// setting and both values, once per change of the differences and again
// every driftLogRepeat while they last, and jobreaper_settings_drift is 1
// until they agree again. Settings the leader's record lacks (an older
// version) are said once at info level, and are no difference.
func (l *LeaderLease) compareSettings(st pgstore.LeaderLeaseState) {
	if !st.Found || st.Held {
		l.setDrift("", nil, nil, st)
		return
	}
	diffs, unknown, err := l.settings.Compare(st.Settings)
	if err != nil {
		l.setDrift("the leader's recorded settings are unreadable; cannot compare (counted as settings drift)",
			[]string{err.Error()}, nil, st)
		return
	}
	lines := make([]string, len(diffs))
	for i, d := range diffs {
		lines[i] = d.String()
	}
	l.setDrift("settings drift: this replica's settings that decide a reap differ from the leader's; "+
		"whichever replica leads decides differently", lines, unknown, st)
}

// setDrift records the outcome of one comparison: drift when diffs is not
// empty, logged with msg.
func (l *LeaderLease) setDrift(msg string, diffs, unknown []string, st pgstore.LeaderLeaseState) {
	drifted, now := len(diffs) > 0, l.now()
	key := strings.Join(diffs, "\n")
	switch {
	case drifted && (key != l.drift.said || now.Sub(l.drift.at) >= driftLogRepeat):
		l.log.Error(msg, "leader", st.Holder.String(), "differences", diffs)
		l.drift.said, l.drift.at = key, now
	case !drifted && l.drift.drifted:
		l.log.Info("settings drift resolved: this replica's settings match the leader's, or this replica leads")
		l.drift.said = ""
	}
	if u := strings.Join(unknown, ","); u != l.drift.unknown {
		if u != "" {
			l.log.Info("the leader's recorded settings lack some settings (it runs an older version); they are not compared until it records them",
				"leader", st.Holder.String(), "settings", unknown)
		}
		l.drift.unknown = u
	}
	l.drift.drifted = drifted
	l.metrics.settingsDrift(drifted)
}
