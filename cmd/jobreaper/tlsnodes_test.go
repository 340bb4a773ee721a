package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/jobreaper/jobreaper/queue"
)

// serverStartTimeout bounds the wait for a redis-server or sentinel of a
// test's own to answer: generous, since two cores are shared with -race
// builds of other tests.
const serverStartTimeout = 60 * time.Second

// issue signs with ca a server certificate whose subjectAltName is san, in
// openssl's form ("IP:127.0.0.2", "DNS:redis.internal,IP:127.0.0.9"), and
// returns its certificate and key files.
func (ca testCA) issue(t *testing.T, name, san string) (cert, key string) {
	t.Helper()
	p := func(f string) string { return filepath.Join(ca.dir, name+"-"+f) }
	if err := os.WriteFile(p("san.ext"), []byte("subjectAltName="+san+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
			"-subj", "/CN=" + name, "-keyout", p("server.key"), "-out", p("server.csr")},
		{"x509", "-req", "-in", p("server.csr"), "-CA", ca.caCert, "-CAkey", ca.caKey, "-CAcreateserial",
			"-days", "2", "-extfile", p("san.ext"), "-out", p("server.crt")},
	} {
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	return p("server.crt"), p("server.key")
}

// roots returns a pool that trusts ca.
func (ca testCA) roots(t *testing.T) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(ca.caCert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no PEM certificate", ca.caCert)
	}
	return pool
}

// freePortsOn returns n distinct TCP ports that are free on ip (any
// address of 127.0.0.0/8 works: Linux routes all of it to lo).
func freePortsOn(t *testing.T, ip string, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatalf("finding a free port on %s: %v", ip, err)
		}
		defer l.Close() // held until all are chosen, so none repeats
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// startProcess runs the command and kills it at cleanup.
func startProcess(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// firstName returns the value of san's first entry: "redis.internal" of
// "DNS:redis.internal,IP:127.0.0.9".
func firstName(san string) string {
	first, _, _ := strings.Cut(san, ",")
	_, name, _ := strings.Cut(first, ":")
	return name
}

// tlsNode is a redis-server of a test's own that speaks only TLS.
type tlsNode struct {
	addr string // ip:port
	// client talks to the node alone, verifying the first name of its
	// certificate.
	client *redis.Client
}

// startTLSNode runs redis-server on a free port of ip, speaking only TLS
// (replication and, with tls-cluster, the cluster bus too) with a
// certificate ca issues for san, requiring password (none when empty),
// with args appended; it waits until the node answers PING.
func startTLSNode(t *testing.T, ca testCA, ip, san, password string, args ...string) tlsNode {
	t.Helper()
	port := freePortsOn(t, ip, 1)[0]
	cert, key := ca.issue(t, fmt.Sprintf("node-%s-%d", ip, port), san)
	// bind-source-addr: a cluster node's bus connections leave from its
	// own address, which its peers learn it by (else the kernel picks
	// 127.0.0.1 for every node).
	all := []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", ip, "--bind-source-addr", ip,
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca.caCert,
		"--tls-auth-clients", "no", "--tls-replication", "yes",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--loglevel", "warning"}
	if password != "" {
		all = append(all, "--requirepass", password, "--masterauth", password)
	}
	startProcess(t, "redis-server", append(all, args...)...)
	n := tlsNode{addr: net.JoinHostPort(ip, strconv.Itoa(port))}
	n.client = redis.NewClient(&redis.Options{Addr: n.addr, Password: password, ContextTimeoutEnabled: true,
		TLSConfig: &tls.Config{RootCAs: ca.roots(t), ServerName: firstName(san), MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = n.client.Close() })
	waitUntil(t, serverStartTimeout, "the TLS redis-server on "+n.addr+" answers", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return n.client.Ping(ctx).Err() == nil
	})
	return n
}

// startTLSSentinel runs a sentinel on a free port of ip, speaking only TLS
// with a certificate ca issues for san, that monitors each of masters
// (name -> host:port, reached over TLS with password), and returns its
// address once it names every master.
func startTLSSentinel(t *testing.T, ca testCA, ip, san, password string, masters map[string]string) string {
	t.Helper()
	port := freePortsOn(t, ip, 1)[0]
	cert, key := ca.issue(t, fmt.Sprintf("sentinel-%s-%d", ip, port), san)
	dir := t.TempDir()
	var conf strings.Builder
	fmt.Fprintf(&conf, "port 0\ntls-port %d\nbind %s\ndir %s\n", port, ip, dir)
	fmt.Fprintf(&conf, "tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\n",
		cert, key, ca.caCert)
	for name, addr := range masters {
		host, mport, _ := net.SplitHostPort(addr)
		fmt.Fprintf(&conf, "sentinel monitor %s %s %s 1\nsentinel auth-pass %s %s\n", name, host, mport, name, password)
	}
	file := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(file, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, "redis-server", file, "--sentinel")
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		TLSConfig: &tls.Config{RootCAs: ca.roots(t), ServerName: firstName(san), MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = sentinel.Close() })
	waitUntil(t, serverStartTimeout, "the TLS sentinel on "+addr+" names every master", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		for name, want := range masters {
			got, err := sentinel.GetMasterAddrByName(ctx, name).Result()
			if err != nil || len(got) != 2 || net.JoinHostPort(got[0], got[1]) != want {
				return false
			}
		}
		return true
	})
	return addr
}

// tlsClient returns the client queue.NewRedisClient builds for redisURL,
// trusting ca and verifying serverName for every node when it is set,
// closed at cleanup; it checks the topology the URL names.
func tlsClient(t *testing.T, redisURL, want string, ca testCA, serverName string) redis.UniversalClient {
	t.Helper()
	rdb, topology, err := queue.NewRedisClient(redisURL, queue.RedisClientOptions{RootCAs: ca.roots(t),
		TLSServerName: serverName, OpTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	if topology != want {
		t.Fatalf("NewRedisClient topology %s, want %s", topology, want)
	}
	return rdb
}
