package pgstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// PassRecordListMax bounds the at-risk and candidate lists of a pass
// record: the status page shows the first 100 of each, and the row the
// leader rewrites every pass stays a few kilobytes.
const PassRecordListMax = 100

// PassRecord is a row of reaper_passes: what a queue set's leader saw in
// its last pass, which every replica's status page shows.
type PassRecord struct {
	// Key is the queue set (LeaderLeaseKey).
	Key string
	// HolderID and HolderHost name the daemon that ran the pass.
	HolderID, HolderHost string
	// At is when the record was written, on the database clock (zero when
	// recording).
	At time.Time
	// Summary, AtRisk and Candidates are JSON: the pass's summary and two
	// arrays of decisions, each at most PassRecordListMax long.
	Summary, AtRisk, Candidates json.RawMessage
}

const recordPassSQL = `
INSERT INTO {schema}.reaper_passes AS p (key, holder_id, holder_host, at, summary, at_risk, candidates)
VALUES (@key, @holder_id, @holder_host, now(), @summary::jsonb, @at_risk::jsonb, @candidates::jsonb)
ON CONFLICT (key) DO UPDATE
   SET holder_id = excluded.holder_id, holder_host = excluded.holder_host, at = excluded.at,
       summary = excluded.summary, at_risk = excluded.at_risk, candidates = excluded.candidates`

// RecordPass replaces the pass record of r.Key with r, in one statement,
// At set to now(). Empty JSON fields are stored as {} and []. It returns a
// wrapped driver error, or the operation's timeout, when PostgreSQL fails.
func (s *Store) RecordPass(ctx context.Context, r PassRecord) error {
	ctx, done := s.core.Op(ctx, "RecordPass")
	_, err := s.core.DB().Exec(ctx, s.core.Q(recordPassSQL), pgx.NamedArgs{
		"key": r.Key, "holder_id": r.HolderID, "holder_host": r.HolderHost,
		"summary": jsonOr(r.Summary, "{}"), "at_risk": jsonOr(r.AtRisk, "[]"), "candidates": jsonOr(r.Candidates, "[]"),
	})
	return done(err)
}

func jsonOr(j json.RawMessage, empty string) string {
	if len(j) == 0 {
		return empty
	}
	return string(j)
}

const passRecordsSQL = `
SELECT key, holder_id, holder_host, at, summary, at_risk, candidates
  FROM {schema}.reaper_passes
 ORDER BY key`

// PassRecords returns every queue set's last pass record, in key order.
// It returns a wrapped driver error, or the operation's timeout, when
// PostgreSQL fails.
func (s *Store) PassRecords(ctx context.Context) ([]PassRecord, error) {
	ctx, done := s.core.Op(ctx, "PassRecords")
	rows, err := s.core.DB().Query(ctx, s.core.Q(passRecordsSQL))
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PassRecord, error) {
		var (
			r          PassRecord
			sum, ar, c []byte
		)
		err := row.Scan(&r.Key, &r.HolderID, &r.HolderHost, &r.At, &sum, &ar, &c)
		r.Summary, r.AtRisk, r.Candidates = sum, ar, c
		return r, err
	})
	return out, done(err)
}

// ReapRecord is one reaped event, with the evidence its detail holds.
type ReapRecord struct {
	JobID, Type, Queue, Worker string
	Generation                 int64
	// At is when the reap was recorded (the database's).
	At time.Time
	// Detail is the event's detail: the reason and the evidence
	// (Evidence's JSON form).
	Detail json.RawMessage
}

// recentReapsSQL reads the last reaped events through
// job_events_kind_at_idx, newest first, with their job's type and queue.
const recentReapsSQL = `
SELECT e.job_id, coalesce(j.type, ''), coalesce(j.queue, ''), coalesce(e.worker, ''), coalesce(e.generation, 0), e.at, e.detail
  FROM {schema}.job_events e
  LEFT JOIN {schema}.jobs j ON j.id = e.job_id
 WHERE e.kind = 'reaped'
 ORDER BY e.at DESC, e.id DESC
 LIMIT @limit`

// RecentReaps returns the last limit reaped events, newest first. It
// returns a wrapped driver error, or the operation's timeout, when
// PostgreSQL fails.
func (s *Store) RecentReaps(ctx context.Context, limit int) ([]ReapRecord, error) {
	ctx, done := s.core.Op(ctx, "RecentReaps")
	rows, err := s.core.DB().Query(ctx, s.core.Q(recentReapsSQL), pgx.NamedArgs{"limit": limit})
	if err != nil {
		return nil, done(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReapRecord, error) {
		var (
			r ReapRecord
			d []byte
		)
		err := row.Scan(&r.JobID, &r.Type, &r.Queue, &r.Worker, &r.Generation, &r.At, &d)
		r.Detail = d
		return r, err
	})
	return out, done(err)
}

// LeaderLeaseDetail is one leader lease row, all of it, for people.
type LeaderLeaseDetail struct {
	Key, HolderID, HolderHost        string
	HolderPID                        int
	AcquiredAt, RenewedAt, ExpiresAt time.Time
	// Settings are the holder's recorded settings (settings drift).
	Settings json.RawMessage
}

// LeaderLeaseDetails is every leader lease row and the database clock of
// the read, which says which are live.
type LeaderLeaseDetails struct {
	Rows []LeaderLeaseDetail
	Now  time.Time
}

const leaderLeaseDetailsSQL = `
SELECT key, holder_id, holder_host, holder_pid, acquired_at, renewed_at, expires_at, settings, now()
  FROM {schema}.leader_leases
 ORDER BY key`

const dbNowSQL = `SELECT now()`

// LeaderLeaseDetails returns every leader lease row, in key order, and
// now(). It returns a wrapped driver error, or the operation's timeout,
// when PostgreSQL fails.
func (s *Store) LeaderLeaseDetails(ctx context.Context) (LeaderLeaseDetails, error) {
	ctx, done := s.core.Op(ctx, "LeaderLeaseDetails")
	var out LeaderLeaseDetails
	if err := s.core.DB().QueryRow(ctx, dbNowSQL).Scan(&out.Now); err != nil {
		return out, done(err)
	}
	rows, err := s.core.DB().Query(ctx, s.core.Q(leaderLeaseDetailsSQL))
	if err != nil {
		return out, done(err)
	}
	out.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (LeaderLeaseDetail, error) {
		var (
			l   LeaderLeaseDetail
			st  []byte
			now time.Time
		)
		err := row.Scan(&l.Key, &l.HolderID, &l.HolderHost, &l.HolderPID, &l.AcquiredAt, &l.RenewedAt, &l.ExpiresAt, &st, &now)
		l.Settings = st
		return l, err
	})
	return out, done(err)
}
