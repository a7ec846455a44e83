package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestServeOnARedisCluster: with redis_cluster the gateway opens a Cluster client on
// redis_url's seed nodes (its host and addr= parameters), and checks every master's memory
// policy: INFO through the Cluster client read one node, any, and a master that evicts would
// drop its slots' keys (an Idempotency-Key's record, a run's tally) as a single server would.
func TestServeOnARedisCluster(t *testing.T) {
	t.Setenv("MYSQL_DSN", testenv.MySQLDSN(t))
	cc := testenv.RedisCluster(t)
	addrs := cc.Options().Addrs
	t.Setenv("REDIS_URL", "redis://"+addrs[0]+"/0?addr="+addrs[1]+"&addr="+addrs[2])
	t.Setenv("REDIS_CLUSTER", "true")
	ctx := context.Background()
	e, err := setup(ctx, "serve", nil, true, nil)
	if err != nil {
		t.Fatalf("setup on a Cluster: %v", err)
	}
	_, cluster := e.rdb.(*redis.ClusterClient)
	e.Close()
	if !cluster {
		t.Fatalf("client %T, want a Cluster client", e.rdb)
	}
	// One master of three may evict.
	var evicting string
	err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		if node.Options().Addr != addrs[2] {
			return nil
		}
		evicting = node.Options().Addr
		if err := node.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
			return err
		}
		return node.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()
	})
	if err != nil || evicting == "" {
		t.Fatalf("set one master evicting (%q): %v", evicting, err)
	}
	if e, err = setup(ctx, "serve", nil, true, nil); err == nil {
		e.Close()
		t.Fatal("started on a Cluster one of whose masters evicts")
	}
	for _, s := range []string{evicting, "maxmemory-policy allkeys-lru"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not say %q", err, s)
		}
	}
}
