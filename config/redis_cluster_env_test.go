package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRedisClusterVariableThatIsNoBooleanStopsTheStart: REDIS_CLUSTER (README: `true` or
// `false`) was read as "1"/"true" or "0"/"false" and anything else was dropped without a word:
// REDIS_CLUSTER=True, TRUE or yes left the gateway opening redis_url's seed node as one server,
// every step on a key of another node's slots then failing (MOVED) — the tally, the duplicate
// check, the reconciler's reads — against README's "a wrong setting stops the gateway with a
// message naming it". A value strconv.ParseBool reads (1, t, TRUE, True, false, ...) sets it;
// any other stops the start naming the variable.
func TestRedisClusterVariableThatIsNoBooleanStopsTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("mysql_dsn: x@tcp(h:1)/d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("REDIS_URL", "redis://h:1")
	for v, want := range map[string]bool{"true": true, "1": true, "True": true, "TRUE": true, "false": false, "0": false, "": false} {
		t.Setenv("REDIS_CLUSTER", v)
		cfg, err := Load(path)
		if err != nil || cfg.RedisCluster != want {
			t.Errorf("REDIS_CLUSTER=%q: %v, cluster %v, want %v", v, err, cfg != nil && cfg.RedisCluster, want)
		}
	}
	for _, v := range []string{"yes", "on", "ture", "false0"} {
		t.Setenv("REDIS_CLUSTER", v)
		cfg, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "REDIS_CLUSTER") {
			t.Errorf("REDIS_CLUSTER=%q: loaded (cluster %v), want the start stopped naming REDIS_CLUSTER (err %v)", v, cfg != nil && cfg.RedisCluster, err)
		}
	}
}
