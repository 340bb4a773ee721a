package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/jobs"
	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
	"github.com/jobreaper/jobreaper/queue/queuetest"
	"github.com/jobreaper/jobreaper/queue/redistest"
)

// topologyClient returns the client queue.NewRedisClient builds for
// redisURL, closed at cleanup, and checks the topology it names.
func topologyClient(t *testing.T, redisURL, want string) redis.UniversalClient {
	t.Helper()
	rdb, topology, err := queue.NewRedisClient(redisURL, queue.RedisClientOptions{OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	if topology != want {
		t.Fatalf("NewRedisClient(%s) topology %s, want %s", redisURL, topology, want)
	}
	return rdb
}

// stalledActiveJob inserts a PROCESSING job past its limits and puts its
// task in q's active list through rdb, as a worker's dequeue would.
func stalledActiveJob(t *testing.T, db *jobstest.DB, rdb redis.UniversalClient, q, id string) {
	t.Helper()
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Generation: 1, Queue: q, Worker: "W1",
		StartedAgo: jobstest.Ago(31 * time.Minute), IdleAgo: 21 * time.Minute})
	// Active as asynq's dequeue makes it: state active, with a lease (an
	// active entry without one is broken).
	if err := queuetest.MakeActive(t.Context(), rdb, q, "report.export", []string{id}); err != nil {
		t.Fatalf("making %s active: %v", id, err)
	}
}

// requireReapPass runs one pass of the daemon against redisURL, with
// flags appended, and checks that it reaped id and set its marker.
func requireReapPass(t *testing.T, db *jobstest.DB, rdb redis.UniversalClient, redisURL, q, id string, flags ...string) {
	t.Helper()
	r := run(t, append([]string{"run", "--once", "--output", "json", "--database-url", db.URL, "--schema", db.Schema,
		"--redis-url", redisURL, "--queues", q}, flags...)...)
	requireExit(t, r, exitOK)
	if doc := requireOneJSONResult(t, r.stdout); string(doc["reaped"]) != "1" || string(doc["errors"]) != "0" {
		t.Fatalf("pass over %s: %s, want 1 reaped and no error", redisURL, r.stdout)
	}
	if row := db.Read(t, id); row.Status != jobs.StatusFailed || row.FailureReason != jobs.ReasonStalled {
		t.Fatalf("row %s = %+v, want FAILED stalled", id, row)
	}
	if v, err := rdb.Get(t.Context(), queue.MarkerKey(id)).Result(); err != nil || v != "1" {
		t.Fatalf("marker of %s = %q (%v), want generation 1", id, v, err)
	}
}

// requireGuardedTask runs a worker over rdb (the start guard, a handler
// that completes) and enqueues one job through queue.Enqueue; the job must
// end COMPLETED.
func requireGuardedTask(t *testing.T, db *jobstest.DB, rdb redis.UniversalClient, q string) {
	t.Helper()
	ctx := t.Context()
	store := db.Store()
	markers, err := queue.NewMarkerStore(rdb)
	if err != nil {
		t.Fatal(err)
	}
	guard := queue.NewGuard(store, markers)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{q: 1}, Concurrency: 2,
		IsFailure: queue.IsFailure, LogLevel: asynq.WarnLevel, ShutdownTimeout: 5 * time.Second})
	mux := asynq.NewServeMux()
	mux.Use(guard.Middleware())
	mux.HandleFunc("report.export", func(ctx context.Context, _ *asynq.Task) error {
		lease, err := jobs.LeaseFromContext(ctx)
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := store.Complete(ctx, tx, lease)
			return err
		})
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	id := unique("Jguard")
	db.Insert(t, jobstest.Job{ID: id, Type: "report.export", Status: jobs.StatusQueued, Queue: q})
	if _, err := queue.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), store, asynq.NewTask("report.export", nil), id); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	jobstest.Eventually(t, "the guarded task completes its job", func() bool {
		return db.Read(t, id).Status == jobs.StatusCompleted
	})
	if row := db.Read(t, id); row.Generation != 1 {
		t.Fatalf("row %+v, want one claim", row)
	}
}

// A Sentinel set of its own: one primary, one replica, one sentinel. A pass
// reaps through the failover client, the sentinel fails over to the
// replica, and the next pass reaps through the new primary; a guarded task
// runs after the failover.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(primary.Addr, "127.0.0.1:"))
	port := freeTCPPort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	primaryPort := strings.TrimPrefix(primary.Addr, "127.0.0.1:")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %s 1\nsentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 20000\n",
		port, dir, primaryPort)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sentinelAddr := "127.0.0.1:" + strconv.Itoa(port)
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: sentinelAddr})
	t.Cleanup(func() { _ = sentinel.Close() })
	ctx := t.Context()
	jobstest.Eventually(t, "the sentinel knows the replica, and it is in sync", func() bool {
		replicas, err := sentinel.Replicas(ctx, "mymaster").Result()
		if err != nil || len(replicas) != 1 {
			return false
		}
		info, err := replica.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})

	redisURL := "redis://" + sentinelAddr + "/0?master_name=mymaster"
	rdb := topologyClient(t, redisURL, queue.TopologySentinel)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	q := unique("sentinel")

	first := unique("Jsent1")
	stalledActiveJob(t, db, rdb, q, first)
	requireReapPass(t, db, rdb, redisURL, q, first)

	if err := sentinel.Failover(ctx, "mymaster").Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	jobstest.Eventually(t, "the replica is the primary", func() bool {
		addr, err := sentinel.GetMasterAddrByName(ctx, "mymaster").Result()
		if err != nil || len(addr) != 2 || "127.0.0.1:"+addr[1] != replica.Addr {
			return false
		}
		role, err := replica.Client(t).Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	})
	// The failover client follows the sentinel's announcement and writes
	// to the new primary (the sentinel turns the old primary into a
	// replica only once it sees it again, which can take longer).
	replicaPort := strings.TrimPrefix(replica.Addr, "127.0.0.1:")
	jobstest.Eventually(t, "the failover client follows the new primary", func() bool {
		info, err := rdb.Info(ctx, "server").Result()
		if err != nil {
			t.Logf("INFO through the failover client: %v", err)
		}
		return err == nil && strings.Contains(info, "tcp_port:"+replicaPort+"\r\n")
	})

	second := unique("Jsent2")
	stalledActiveJob(t, db, rdb, q, second)
	requireReapPass(t, db, rdb, redisURL, q, second)
	if v, err := replica.Client(t).Get(ctx, queue.MarkerKey(second)).Result(); err != nil || v != "1" {
		t.Fatalf("marker of %s on the new primary = %q (%v)", second, v, err)
	}
	requireGuardedTask(t, db, rdb, q)
}

// A 3-node Cluster of its own: a pass reaps through the cluster client and
// a guarded task runs.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	var nodes []*redistest.Server
	var addrs []string
	for range 3 {
		n := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	ctx := t.Context()
	jobstest.Eventually(t, "every node says the cluster is ok", func() bool {
		for _, n := range nodes {
			info, err := n.Client(t).ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})

	redisURL := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	rdb := topologyClient(t, redisURL, queue.TopologyCluster)
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	q := unique("cluster")
	id := unique("Jclus")
	stalledActiveJob(t, db, rdb, q, id)
	requireReapPass(t, db, rdb, redisURL, q, id)
	requireGuardedTask(t, db, rdb, q)
}
