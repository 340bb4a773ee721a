package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobreaper/jobreaper/jobs/jobstest"
	"github.com/jobreaper/jobreaper/queue"
)

// Case B43: a TLS sentinel on 127.0.0.1 and a TLS primary on 127.0.0.2,
// each certificate naming only its own address, one CA. Each connection
// verifies the certificate of the address it dialled, so the daemon and a
// worker's client connect; a stalled job is reaped and its marker lands in
// the primary. A primary whose certificate names neither address is
// refused with one line naming the address dialled and the names the
// certificate lists.
func TestCase_B43_SentinelOverTLSEachNodeItsOwnCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, t.TempDir(), "b43")
	const password = "b43-Secret-2718"
	primary := startTLSNode(t, ca, "127.0.0.2", "IP:127.0.0.2", password)
	stranger := startTLSNode(t, ca, "127.0.0.3", "DNS:redis.internal,IP:127.0.0.9", password)
	sentinel := startTLSSentinel(t, ca, "127.0.0.1", "IP:127.0.0.1", password,
		map[string]string{"mymaster": primary.addr, "othermaster": stranger.addr})
	redisURL := "rediss://:" + password + "@" + sentinel + "/0?master_name=mymaster"

	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	q, id := unique("b43"), unique("Jb43")
	stalledActiveJob(t, db, primary.client, q, id)

	t.Run("TheDaemonReapsAndTheMarkerLandsInThePrimary", func(t *testing.T) {
		requireReapPass(t, db, primary.client, redisURL, q, id, "--redis-ca-file", ca.caCert)
	})

	t.Run("AWorkersStartGuardRunsThroughTheSameURL", func(t *testing.T) {
		requireGuardedTask(t, db, tlsClient(t, redisURL, queue.TopologySentinel, ca, ""), q)
	})

	t.Run("APrimaryWhoseCertificateNamesNeitherAddressIsRefused", func(t *testing.T) {
		other := strings.Replace(redisURL, "master_name=mymaster", "master_name=othermaster", 1)
		r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", other, "--redis-ca-file", ca.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "cannot connect to Redis at rediss://:xxxxx@"+sentinel,
			"the certificate of "+stranger.addr, "DNS:redis.internal", "IP:127.0.0.9", "not 127.0.0.3",
			"--redis-tls-server-name")
		requireNoSecret(t, r, password)
	})
}

// redis_tls_server_name: every node's certificate names redis.internal and
// no address. Without the setting each address is verified and refused;
// with it every node (sentinel, primary, a single server) is verified as
// redis.internal, for the daemon and a worker's client alike.
func TestRedisTLSServerNameOverridesTheNameOfEveryNode(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, t.TempDir(), "override")
	const password = "override-Secret-1414"
	primary := startTLSNode(t, ca, "127.0.0.2", "DNS:redis.internal", password)
	sentinel := startTLSSentinel(t, ca, "127.0.0.1", "DNS:redis.internal", password,
		map[string]string{"mymaster": primary.addr})
	single := startTLSNode(t, ca, "127.0.0.1", "DNS:redis.internal", password)
	sentinelURL := "rediss://:" + password + "@" + sentinel + "/0?master_name=mymaster"
	singleURL := "rediss://:" + password + "@" + single.addr + "/0"

	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	q := unique("override")

	t.Run("WithoutItTheSentinelsAddressIsRefused", func(t *testing.T) {
		r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", sentinelURL, "--redis-ca-file", ca.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "the certificate of "+sentinel, "DNS:redis.internal", "not 127.0.0.1",
			"--redis-tls-server-name (JOBREAPER_REDIS_TLS_SERVER_NAME)")
		requireNoSecret(t, r, password)
	})

	t.Run("WithItTheDaemonAndAWorkerGoThroughTheSentinel", func(t *testing.T) {
		id := unique("Jover")
		stalledActiveJob(t, db, primary.client, q, id)
		requireReapPass(t, db, primary.client, sentinelURL, q, id,
			"--redis-ca-file", ca.caCert, "--redis-tls-server-name", "redis.internal")
		requireGuardedTask(t, db, tlsClient(t, sentinelURL, queue.TopologySentinel, ca, "redis.internal"), q)
	})

	t.Run("ASingleServerHonoursIt", func(t *testing.T) {
		// A schema of its own: the sentinel subtest's reaped job has its
		// marker in that primary, and a pass over this other Redis would
		// find it missing and hold it (no asynq server lives here yet).
		db := jobstest.New(t)
		db.JobType(t, "report.export", "30 minutes", "", "")
		r := run(t, "run", "--once", "--database-url", db.URL, "--schema", db.Schema,
			"--redis-url", singleURL, "--redis-ca-file", ca.caCert, "--queues", q)
		requireExit(t, r, exitCannotRun)
		requireOneLineError(t, r, "the certificate of "+single.addr, "DNS:redis.internal", "--redis-tls-server-name")
		requireNoSecret(t, r, password)

		id := unique("Jsingle")
		stalledActiveJob(t, db, single.client, q, id)
		requireReapPass(t, db, single.client, singleURL, q, id,
			"--redis-ca-file", ca.caCert, "--redis-tls-server-name", "redis.internal")
		requireGuardedTask(t, db, tlsClient(t, singleURL, queue.TopologySingle, ca, "redis.internal"), q)
	})
}

// A 3-node TLS Cluster (tls-cluster: the bus speaks TLS too) on 127.0.0.1,
// 127.0.0.2 and 127.0.0.3, each certificate naming only its own address:
// the cluster client verifies each node by the address it dialled, so a
// pass reaps and a guarded task runs. The queue is chosen to live on a node
// other than the first seed, whose name alone used to be verified.
func TestRedisClusterOverTLSEachNodeItsOwnCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, t.TempDir(), "cluster")
	const password = "cluster-Secret-1732"
	var nodes []tlsNode
	var addrs []string
	for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		bus := freePortsOn(t, ip, 1)[0]
		n := startTLSNode(t, ca, ip, "IP:"+ip, password, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus), "--tls-cluster", "yes")
		nodes = append(nodes, n)
		addrs = append(addrs, n.addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes", "--tls", "--cacert", ca.caCert)
	cctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	create := exec.CommandContext(cctx, "redis-cli", args...)
	create.Env = append(os.Environ(), "REDISCLI_AUTH="+password)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	ctx := t.Context()
	waitUntil(t, serverStartTimeout, "every node says the cluster is ok", func() bool {
		for _, n := range nodes {
			info, err := n.client.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})

	// A queue whose hash slot a node other than the first seed serves.
	var q string
	for q == "" || clusterOwner(t, nodes[0], q) == addrs[0] {
		q = unique("tlscluster")
	}
	redisURL := "rediss://:" + password + "@" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	rdb := tlsClient(t, redisURL, queue.TopologyCluster, ca, "")
	db := jobstest.New(t)
	db.JobType(t, "report.export", "30 minutes", "", "")
	id := unique("Jtlsclus")
	stalledActiveJob(t, db, rdb, q, id)
	requireReapPass(t, db, rdb, redisURL, q, id, "--redis-ca-file", ca.caCert)
	requireGuardedTask(t, db, rdb, q)
}

// clusterOwner returns the address of the node that serves the hash slot
// of q (asynq's keys of a queue carry {q} as their hash tag), as n's view
// of the cluster says.
func clusterOwner(t *testing.T, n tlsNode, q string) string {
	t.Helper()
	ctx := t.Context()
	slot, err := n.client.ClusterKeySlot(ctx, q).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %s: %v", q, err)
	}
	ranges, err := n.client.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr
		}
	}
	t.Fatalf("no node serves slot %d of %s: %+v", slot, q, ranges)
	return ""
}
