package jobs

import "github.com/jobreaper/jobreaper/internal/idcheck"

// MaxIDLength bounds a job ID: 1,024 bytes. The ID is the primary key of
// jobs and, with a batch token of up to MaxBatchTokenLength bytes, of
// job_batches; a PostgreSQL B-tree entry must fit in a third of an 8 kB
// page (2,704 bytes for B-tree version 4, "index row size exceeds btree
// maximum"), so an uncompressible ID much over 2 kB fails to insert at
// all. 1,024 bytes leaves room for the token and the tuple headers, and is
// far above any ID a product makes (a UUID is 36 bytes). The limit is
// enforced in code, not by a CHECK on the table: a CHECK would fail a
// migration on a database that already holds a longer ID, and jobreaper
// never inserts job rows itself.
const MaxIDLength = 1024

// CheckID reports whether id can be a job ID: not empty, valid UTF-8 (the
// encoding of a text column in a UTF8 database, which rejects anything else
// with "invalid byte sequence"), without a NUL byte (which no PostgreSQL
// text value can hold, whatever the encoding), and at most MaxIDLength
// bytes. It sends nothing anywhere. asynq accepts any string as a task ID,
// so another producer sharing the Redis can enqueue a task whose ID no row
// can have; the start guard refuses it for good.
//
// The error wraps ErrBadID and says which rule failed; it shows the ID
// escaped (%q), so a log line carrying it stays one readable line. An ID
// over the length limit is shown by its first 64 bytes only.
func CheckID(id string) error { return idcheck.CheckID(id) }
