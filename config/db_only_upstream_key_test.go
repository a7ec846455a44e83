package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDatabaseOnlyCommandsLoadWithoutTheUpstreamKeys: the commands that use the database alone
// (LoadWithoutRedis: user disable, grant, balance, audit, prune, ...) never call an upstream,
// yet the fleet's config naming api_key_env refused them wherever that variable was not set —
// an operator disabling an abusive user "with whatever config is at hand" had first to copy
// the provider's secret onto the host. serve (Load) still refuses an empty key.
func TestDatabaseOnlyCommandsLoadWithoutTheUpstreamKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	body := "mysql_dsn: x@tcp(h:1)/d\nupstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n" +
		"    api_key_env: TOLLGATE_TEST_UNSET_KEY\n    models: ['*']\n  - name: b\n    kind: anthropic\n    base_url: https://api.example.com\n" +
		"    api_key_env: tollgate_test_unset_lower\n    models: ['fake-gpt']\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"REDIS_URL", "MYSQL_DSN", "UPSTREAM_URL", "UPSTREAM_API_KEY", "TOLLGATE_TEST_UNSET_KEY", "tollgate_test_unset_lower"} {
		t.Setenv(v, "")
	}
	if _, err := LoadWithoutRedis(path); err != nil {
		t.Fatalf("a database-only command refused for an upstream key it never uses: %v", err)
	}
	t.Setenv("REDIS_URL", "redis://h:1/0")
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "TOLLGATE_TEST_UNSET_KEY") {
		t.Fatalf("serve's load: error %v, want the unset key named", err)
	}
}
