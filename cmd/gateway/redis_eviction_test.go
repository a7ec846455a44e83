package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestServeRefusesARedisThatMayEvict: a Redis with a memory limit and a policy that evicts
// would drop the gateway's keys before their TTL when full — an Idempotency-Key's record (the
// retry then runs and is charged again), a run's tally or lease — without an error anywhere.
// `serve` (and `reconcile`, through the same setup) refuses to start on it, naming the
// setting and the fix, unless redis_allow_eviction says the operator accepts it; a server
// without a limit, or one that refuses writes when full, is started on as before.
func TestServeRefusesARedisThatMayEvict(t *testing.T) {
	t.Setenv("MYSQL_DSN", testenv.MySQLDSN(t))
	allow := filepath.Join(t.TempDir(), "allow.yaml")
	if err := os.WriteFile(allow, []byte("redis_allow_eviction: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	evicting := testenv.PrivateRedisURL(t, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
	for _, tc := range []struct {
		name, url string
		args      []string
		refusal   []string // what the error must say; nil: starts
	}{
		{"evicting", evicting, nil, []string{"maxmemory-policy allkeys-lru", "noeviction", "redis_allow_eviction"}},
		{"evicting, allowed", evicting, []string{"-config", allow}, nil},
		{"limit without eviction", testenv.PrivateRedisURL(t, "--maxmemory", "64mb", "--maxmemory-policy", "noeviction"), nil, nil},
		{"no limit", testenv.PrivateRedisURL(t), nil, nil},
		{"policy unreadable", infoDenied(t), nil, []string{"INFO", "redis_allow_eviction"}},
		{"policy unreadable, allowed", infoDenied(t), []string{"-config", allow}, nil},
	} {
		t.Setenv("REDIS_URL", tc.url)
		e, err := setup(context.Background(), "serve", tc.args, true, nil)
		if err == nil {
			e.Close()
		}
		switch {
		case tc.refusal == nil && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refusal != nil && err == nil:
			t.Errorf("%s: started", tc.name)
		case tc.refusal != nil:
			for _, s := range tc.refusal {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%s: refusal %q does not say %q", tc.name, err, s)
				}
			}
		}
	}
}

// TestAllowedEvictionIsLogged: an operator who allowed an evicting Redis still gets a warning
// naming its settings at every start.
func TestAllowedEvictionIsLogged(t *testing.T) {
	opt, err := redis.ParseURL(testenv.PrivateRedisURL(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	core, logs := observer.New(zapcore.WarnLevel)
	if err := checkRedisKeepsKeys(context.Background(), rdb, true, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 1 {
		t.Fatalf("%d warnings, want 1", logs.Len())
	}
	f := logs.All()[0].ContextMap()
	if f["maxmemory"] != int64(64<<20) || f["maxmemory_policy"] != "volatile-lru" {
		t.Errorf("warning fields %v", f)
	}
}

// infoDenied is a private Redis whose user may run every command but INFO, as a locked-down
// ACL may have it.
func infoDenied(t *testing.T) string {
	u := testenv.PrivateRedisURL(t, strings.Fields("--user default off --user gw on >gw-secret ~* &* +@all -info")...)
	return strings.Replace(u, "redis://", "redis://gw:gw-secret@", 1)
}
