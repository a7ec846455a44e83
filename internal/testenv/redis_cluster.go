package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster starts a Redis Cluster of three masters (no replicas) on loopback, in a
// directory of the test's, and returns a client of it, closed and the servers stopped at
// cleanup. The ports are TOLLGATE_TEST_REDIS_CLUSTER_PORT and the five after it (three
// servers, then their cluster bus ports) when it is set, else ports the kernel finds free.
// A cluster that does not start (a server that cannot bind its port: another program may take
// it between its draw and the server's start, or an outgoing connection borrow it) is started
// again, up to clusterTries times, on ports drawn anew (the same ones a moment later when set). Like the other services, redis-server
// and redis-cli must be there (scripts/services.sh installs them): a test that needs a
// Cluster and cannot start one fails.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	fixed := os.Getenv("TOLLGATE_TEST_REDIS_CLUSTER_PORT") != ""
	for try := 1; ; try++ {
		cc, err := startCluster(t, clusterPorts(t), t.TempDir())
		if err == nil {
			return cc
		}
		if try == clusterTries {
			t.Fatalf("start a Redis Cluster: %v", err)
		}
		t.Logf("start a Redis Cluster (try %d): %v", try, err)
		if fixed {
			// The same ports again, a moment later: the kernel lends loopback ports to outgoing
			// connections too, and such a loan is brief.
			time.Sleep(2 * time.Second)
		}
	}
}

const clusterTries = 3

// startCluster starts RedisCluster's servers on ports in dir, forms the cluster and returns
// its client, the servers stopped at t's cleanup. An error holds the servers' logs; they are
// stopped by then, so that another try may take their ports.
func startCluster(t testing.TB, ports []int, dir string) (cc *redis.ClusterClient, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stops []func()
	defer func() {
		if err != nil { // the servers' own words on why the cluster did not form
			logs, _ := filepath.Glob(filepath.Join(dir, "redis-*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				err = fmt.Errorf("%w\n%s:\n%s", err, filepath.Base(l), b)
			}
			for _, stop := range stops {
				stop()
			}
			return
		}
		for _, stop := range stops {
			t.Cleanup(stop)
		}
	}()
	var addrs []string
	var nodes []*redis.Client
	for i := range 3 {
		port, bus := strconv.Itoa(ports[i]), strconv.Itoa(ports[3+i])
		cmd := DiesWithTests(exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--cluster-enabled", "yes",
			"--cluster-port", bus, "--cluster-config-file", "nodes-"+port+".conf", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis-"+port+".log")))
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stops = append(stops, func() { _ = cmd.Process.Kill(); <-exited })
		addr := net.JoinHostPort("127.0.0.1", port)
		n := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer n.Close()
		if err := poll(ctx, "redis-server "+addr+" answering", func() (bool, error) {
			select {
			case <-exited:
				return false, fmt.Errorf("redis-server %s exited", addr)
			default:
			}
			// Dialled first by hand: go-redis logs every dial it fails.
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return false, nil
			}
			c.Close()
			// Its own process answering, not another server that took the port first.
			info, err := n.Info(ctx, "server").Result()
			if err == nil && !strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
				return false, fmt.Errorf("another server answers on %s", addr)
			}
			return err == nil, nil
		}); err != nil {
			return nil, err
		}
		addrs, nodes = append(addrs, addr), append(nodes, n)
	}
	out, err := exec.CommandContext(ctx, "redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for i, n := range nodes {
		if err := poll(ctx, "cluster state ok on "+addrs[i], func() (bool, error) {
			info, err := n.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3"), nil
		}); err != nil {
			return nil, err
		}
	}
	cc = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	if err := poll(ctx, "the client seeing three masters", func() (bool, error) {
		cc.ReloadState(ctx)
		var masters atomic.Int32 // ForEachMaster calls it on every master at once
		err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil })
		return err == nil && masters.Load() == 3, nil
	}); err != nil {
		return nil, err
	}
	return cc, nil
}

// poll calls ready until it holds or fails, or ctx ends.
func poll(ctx context.Context, what string, ready func() (bool, error)) error {
	for {
		ok, err := ready()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// clusterPorts are RedisCluster's six ports.
func clusterPorts(t testing.TB) []int {
	t.Helper()
	if v := os.Getenv("TOLLGATE_TEST_REDIS_CLUSTER_PORT"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p <= 0 || p+5 > 65535 {
			t.Fatalf("TOLLGATE_TEST_REDIS_CLUSTER_PORT %q is not a port with five after it", v)
		}
		return []int{p, p + 1, p + 2, p + 3, p + 4, p + 5}
	}
	var ports []int
	for range 6 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		defer l.Close() // held until all six are found: no port twice
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
