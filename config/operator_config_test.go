package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadYAML loads body (after a working DSN and Redis URL) as a config file.
func loadYAML(t *testing.T, body string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", "")
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("UPSTREAM_URL", "")
	t.Setenv("UPSTREAM_API_KEY", "")
	return Load(path)
}

// An upstream's base_url is joined as base_url + "/v1/chat/completions" (and the caller's
// query): a query or fragment in it makes every call's URL wrong, a base_url that already ends
// in /v1 (what OpenAI's SDKs call their base URL) sends every call to /v1/v1/... and the
// provider's 404 is passed through to callers as theirs, and credentials in it go to the
// provider as basic auth and into error messages. Each must stop the start, naming the
// setting and not printing the credentials.
func TestUpstreamBaseURLShapeIsChecked(t *testing.T) {
	for _, tc := range []struct{ base, want string }{
		{"https://llm.internal/openai?api-version=2024-06-01", "query"},
		{"https://llm.internal/openai#frag", "fragment"},
		{"https://api.openai.com/v1", "/v1"},
		{"https://api.openai.com/v1/", "/v1"},
		{"https://svc:hunter2-upstream@llm.internal", "credentials"},
		{"https://hunter2-token@llm.internal", "credentials"},
	} {
		t.Run(tc.base, func(t *testing.T) {
			_, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: "+tc.base+"\n    models: ['*']\n")
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "upstreams[0].base_url") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name upstreams[0].base_url and %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error prints the credentials: %v", err)
			}
		})
	}
	for _, base := range []string{"https://api.openai.com", "https://api.openai.com/", "https://openrouter.ai/api", "http://127.0.0.1:9090"} {
		if _, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: "+base+"\n    models: ['*']\n"); err != nil {
			t.Errorf("base_url %s refused: %v", base, err)
		}
	}
}

// api_key_env names an environment variable. An operator who pastes the key itself there (a
// common slip: the field is next to base_url) got "environment variable sk-... is empty": the
// key printed to stderr and from there to the deployment's logs.
func TestAPIKeyEnvThatIsNotAVariableNameIsRefusedWithoutPrintingIt(t *testing.T) {
	_, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    api_key_env: sk-proj-hunter2secret\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "upstreams[0].api_key_env") {
		t.Fatalf("error %v, want it to name upstreams[0].api_key_env", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error prints what may be the key itself: %v", err)
	}
	// A proper name that is unset is still named, so the operator knows what to export.
	_, err = loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    api_key_env: TOLLGATE_TEST_UNSET_KEY\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_TEST_UNSET_KEY") {
		t.Errorf("unset variable: error %v, want it to name TOLLGATE_TEST_UNSET_KEY", err)
	}
}
