package runstate_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// TestMemoryPolicyOfARealServer: the limit and policy are read from a running server, and a
// server that may evict keys before their TTL is told apart from one that never does (no
// limit, or a limit it enforces by refusing writes).
func TestMemoryPolicyOfARealServer(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want      runstate.MemoryPolicy
		mayEvict  bool
		whyEvicts string
	}{
		{nil, runstate.MemoryPolicy{MaxMemory: 0, Policy: "noeviction"}, false, ""},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"},
			runstate.MemoryPolicy{MaxMemory: 64 << 20, Policy: "noeviction"}, false, ""},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"},
			runstate.MemoryPolicy{MaxMemory: 64 << 20, Policy: "volatile-lru"}, true, "every gateway key has a TTL"},
		{[]string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lfu"},
			runstate.MemoryPolicy{MaxMemory: 64 << 20, Policy: "allkeys-lfu"}, true, "any key"},
		// Without a limit a policy never applies.
		{[]string{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"},
			runstate.MemoryPolicy{MaxMemory: 0, Policy: "allkeys-lru"}, false, ""},
	} {
		opt, err := redis.ParseURL(testenv.PrivateRedisURL(t, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(opt)
		got, err := runstate.ReadMemoryPolicy(context.Background(), rdb)
		rdb.Close()
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got != tc.want {
			t.Errorf("%v: read %+v, want %+v", tc.args, got, tc.want)
		}
		if got.MayEvict() != tc.mayEvict {
			t.Errorf("%v: MayEvict %v, want %v %s", tc.args, got.MayEvict(), tc.mayEvict, tc.whyEvicts)
		}
	}
}

// TestMemoryInfoThatCannotBeReadIsAnError: a reply without the two fields (a proxy that
// answers INFO its own way) or with a limit that is not a byte count is not taken for "no limit".
func TestMemoryInfoThatCannotBeReadIsAnError(t *testing.T) {
	for _, info := range []string{
		"",
		"# Memory\r\nused_memory:1000\r\n",
		"# Memory\r\nmaxmemory:0\r\n",
		"# Memory\r\nmaxmemory_policy:noeviction\r\n",
		"# Memory\r\nmaxmemory:lots\r\nmaxmemory_policy:noeviction\r\n",
		"# Memory\r\nmaxmemory:-1\r\nmaxmemory_policy:noeviction\r\n",
	} {
		if p, err := runstate.ParseMemoryInfo(info); err == nil {
			t.Errorf("%q read as %+v, want an error", info, p)
		}
	}
	p, err := runstate.ParseMemoryInfo("# Memory\r\nused_memory:1000\r\nmaxmemory:1048576\r\nmaxmemory_human:1.00M\r\nmaxmemory_policy:volatile-ttl\r\n")
	if err != nil || p != (runstate.MemoryPolicy{MaxMemory: 1 << 20, Policy: "volatile-ttl"}) {
		t.Errorf("read %+v, %v", p, err)
	}
}
