package config

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestExampleConfigLoads(t *testing.T) {
	t.Setenv("MYSQL_DSN", "u:p@tcp(127.0.0.1:3306)/tollgate")
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
	cfg, err := Load("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Plan("standard").AllowanceCredits.MicroAt(cfg.CreditMicro) != 2_000_000 {
		t.Fatalf("standard allowance = %+v", cfg.Plan("standard"))
	}
	prices, err := cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	if p, _, _ := prices.Lookup("fake-claude"); p.CacheWrite != 3_750_000 || p.CacheWrite1h != 6_000_000 {
		t.Fatalf("fake-claude cache write prices %+v, want 3.75 and 6.00 USD/M", p)
	}
}

func TestEnvironmentOverridesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("mysql_dsn: from-file\nredis_url: redis://file:1/0\nlisten_addr: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYSQL_DSN", "env:dsn@tcp(h:1)/db")
	t.Setenv("REDIS_URL", "")
	t.Setenv("LISTEN_ADDR", "127.0.0.1:2")
	t.Setenv("UPSTREAM_URL", "http://127.0.0.1:3")
	t.Setenv("UPSTREAM_API_KEY", "sk-test")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MySQLDSN != "env:dsn@tcp(h:1)/db" || cfg.RedisURL != "redis://file:1/0" || cfg.ListenAddr != "127.0.0.1:2" ||
		cfg.Upstreams[0].BaseURL != "http://127.0.0.1:3" || cfg.Upstreams[0].APIKey != "sk-test" {
		t.Fatalf("cfg = %+v", cfg)
	}
}

func TestBadSettingsAreNamed(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"redis_url: http://x\n", "redis_url"},
		{"limits:\n  max_body_bytes: 10\n", "limits.max_body_bytes"},
		{"limits:\n  max_body_bytes: 4194304\n  max_event_bytes: 6291456\n", "limits.max_event_bytes"},
		// Under one body's limit, a caller's largest request could never be read.
		{"limits:\n  max_body_memory: 1048576\n", "limits.max_body_memory"},
		{"limits:\n  max_body_memory_per_caller: 1048576\n", "limits.max_body_memory_per_caller"},
		{"limits:\n  max_body_memory: 67108864\n  max_body_memory_per_caller: 134217728\n", "limits.max_body_memory_per_caller"},
		// Under one answer's limit, the largest answer could never be read.
		{"limits:\n  max_response_memory: 1048576\n", "limits.max_response_memory"},
		{"limits:\n  max_response_memory_per_caller: 1048576\n", "limits.max_response_memory_per_caller"},
		{"limits:\n  max_response_memory: 67108864\n  max_response_memory_per_caller: 134217728\n", "limits.max_response_memory_per_caller"},
		{"holds:\n  tally_ttl: 10m\n", "holds.tally_ttl"},
		{"dedup:\n  replay_ttl: 0s\n", "dedup.replay_ttl"},
		{"limits:\n  key_cache_ttl: 1h\n", "limits.key_cache_ttl"},
		{"limits:\n  settle_timeout: 10m\n", "limits.settle_timeout"},
		{"limits:\n  settle_timeout: 1ms\n", "limits.settle_timeout"},
		// A settlement that shares a batch with an admission waits up to admit_timeout for it,
		// then up to settle_timeout for its retry alone: a run settled on request must commit
		// within both before its close mark (the longest a call may live: 7 min here) lapses.
		{"limits:\n  settle_timeout: 415s\n  admit_timeout: 10s\n", "limits.settle_timeout"},
		// ...and its last script, writes and COMMIT, sent just before that deadline is waited
		// for past it up to the driver's read timeout (30 s unless the DSN says otherwise).
		{"limits:\n  settle_timeout: 400s\n", "limits.settle_timeout"},
		{"holds:\n  heartbeat_interval: 60s\n", "holds.heartbeat_interval"},
		// One missed beat (a Redis hiccup) must not lapse a lease: the call's run would be
		// settled, or its reservation dropped, while it still runs.
		{"holds:\n  lease_ttl: 30s\n  heartbeat_interval: 20s\n", "holds.heartbeat_interval"},
		// Redis keeps these in milliseconds: under one, the SET ... PX 0 they are written
		// with is an error (503 for a resent request; no reconcile lock ever taken).
		{"dedup:\n  window: 500us\n", "dedup.window"},
		{"holds:\n  reconcile_lock_ttl: 500us\n", "holds.reconcile_lock_ttl"},
		// ...and every lease and the staleness of a named run's reservations (PX 0 again: no
		// lease ever written, a reservation dropped the millisecond after it was made).
		{"holds:\n  lease_ttl: 900us\n  heartbeat_interval: 400us\n", "holds.lease_ttl"},
		// Past about 292 years a sum of durations wraps negative: hold_ttl plus a reconcile pass
		// needed a negative tally_ttl, and 48h passed for a hold that outlives its tally.
		{"holds:\n  hold_ttl: 2562000h\n  run_ttl: 2562000h\n  reconcile_interval: 100h\n", "holds.hold_ttl"},
		{"dedup:\n  replay_ttl: 2562000h\n", "dedup.replay_ttl"},
		// Every key of every call carries the prefix: one pasted from a file multiplied what
		// Redis holds, and past 64 KiB its record (redis_prefix.prefix) could not hold it.
		{"redis_key_prefix: " + strings.Repeat("p", 256) + "\n", "redis_key_prefix (TOLLGATE_REDIS_PREFIX)"},
		// A call naming a model past 128 bytes is refused (model_too_long): a price or an
		// upstream entry longer than that serves no call.
		{"models:\n  " + strings.Repeat("m", 129) + ":\n    input: 1\n    output: 1\n", "models." + strings.Repeat("m", 129)},
		{"models:\n  m:\n    input: 1\n    output: 1\nupstreams:\n  - name: a\n    kind: openai\n    base_url: http://x\n    models: [m" +
			strings.Repeat("x", 128) + "]\n", "upstreams[0].models"},
		{"models:\n  m:\n    input: 1.1234567\n", "decimal places"},
		{"models:\n  m:\n    input: -1\n", "non-negative"},
		{"models:\n  m:\n    input: 1\n    output_bound_field: max_output\n", "models.m.output_bound_field"},
		{"plans:\n  standard:\n    max_in_flight: 0\n", "plans.standard"},
		{"upstreams:\n  - name: a\n    kind: grpc\n    base_url: http://x\n    models: ['*']\n", "upstreams[0].kind"},
		{"no_such_setting: 1\n", `unknown setting "no_such_setting"`},
		// Said as a setting, not as yaml.v3's Go type ("not found in type config.Limits").
		{"limits:\n  max_body_byte: 5\n", `line 4: unknown setting "max_body_byte"`},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		body := "mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\n" + tc.yaml
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("REDIS_URL", "")
		t.Setenv("MYSQL_DSN", "")
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name %q", tc.yaml, err, tc.want)
		}
	}
}

// TestSettleTimeoutCountsTheDSNReadTimeout: a settlement's last script is waited for up to the
// driver's read timeout past settle_timeout, so a DSN that lengthens it leaves less room for
// settle_timeout before a run's close mark lapses.
func TestSettleTimeoutCountsTheDSNReadTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("redis_url: redis://h:1/0\nlimits:\n  settle_timeout: 300s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", "")
	t.Setenv("MYSQL_DSN", "x@tcp(h:1)/d")
	if _, err := Load(path); err != nil {
		t.Fatalf("settle_timeout 300s with the default read timeout: %v", err)
	}
	t.Setenv("MYSQL_DSN", "x@tcp(h:1)/d?readTimeout=2m")
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "limits.settle_timeout") {
		t.Fatalf("settle_timeout 300s with a 2m read timeout: error %v, want it to name limits.settle_timeout", err)
	}
}

func TestMissingDSNStopsTheStart(t *testing.T) {
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("REDIS_URL", "redis://h:1/0")
	_, err := Load("")
	if err == nil || !strings.Contains(err.Error(), "MYSQL_DSN") {
		t.Fatalf("err = %v", err)
	}
}

// TestDatabaseCommandsNeedNoRedisURL: a command that uses the database alone loads a config
// without redis_url (an audit from a host that has only the database); serve still needs one,
// and a redis_url that is set is checked either way.
func TestDatabaseCommandsNeedNoRedisURL(t *testing.T) {
	t.Setenv("MYSQL_DSN", "x@tcp(h:1)/d")
	t.Setenv("REDIS_URL", "")
	if _, err := LoadWithoutRedis(""); err != nil {
		t.Errorf("a database command without redis_url: %v, want it loaded", err)
	}
	if _, err := Load(""); err == nil || !strings.Contains(err.Error(), "REDIS_URL") {
		t.Errorf("serve without redis_url: %v, want it named", err)
	}
	t.Setenv("REDIS_URL", "http://not-redis")
	if _, err := LoadWithoutRedis(""); err == nil || !strings.Contains(err.Error(), "REDIS_URL") {
		t.Errorf("a database command with a wrong redis_url: %v, want it named", err)
	}
}

func TestWarningsNameAHoldShorterThanTheLongestCall(t *testing.T) {
	c := Default()
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("defaults warn: %v", w)
	}
	c.Holds.HoldTTL = time.Minute
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "holds.hold_ttl") {
		t.Fatalf("hold_ttl of a minute: warnings %v", w)
	}
}

// An operator's models section replaces the built-in demo price list: a model it does not
// name is not priced (nothing is served at a price nobody configured).
func TestModelsSectionReplacesTheDemoPrices(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	body := "mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\nmodels:\n  gpt-4o:\n    input: 2.5\n    cache_read: 1.25\n    cache_write: 2.5\n    output: 10\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", "")
	t.Setenv("MYSQL_DSN", "")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	tbl, _ := cfg.PriceTable()
	if got := tbl.Models(); len(got) != 1 {
		t.Fatalf("priced models %v, want only [gpt-4o]", got)
	}
}

// TestPlanAmountsThatOverflowAreRefused: a plan's credits are converted to micro-USD at
// credit_micro; an amount whose conversion passes int64 wraps to a negative (or wrong) number
// of micro-USD — a cap below zero makes every charge a credit — so it must stop the start.
func TestPlanAmountsThatOverflowAreRefused(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"plans:\n  big:\n    allowance_credits: 99999999999999\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 500\n", "plans.big"},
		{"plans:\n  big:\n    allowance_credits: 2000\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 10000000000000\n", "plans.big"},
		{"credit_micro: 10000000000000000\n", "credit_micro"},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		body := "mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\n" + tc.yaml
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(path)
		if err == nil {
			for name, p := range cfg.Plans {
				t.Errorf("%q loaded: plan %s allowance %d µUSD, max_run_cost %d µUSD, hold %d µUSD", tc.yaml, name,
					p.AllowanceCredits.MicroAt(cfg.CreditMicro), p.MaxRunCostCredits.MicroAt(cfg.CreditMicro), p.HoldNormalCredits.MicroAt(cfg.CreditMicro))
			}
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v does not name %s", tc.yaml, err, tc.want)
		}
	}
}

// The demo serves Anthropic clients too: fake-claude goes to the fake upstream's Anthropic
// routes, and UPSTREAM_URL (make run, docker compose) moves both entries of that one upstream.
func TestExampleServesBothWireFormatsFromOneUpstreamURL(t *testing.T) {
	t.Setenv("MYSQL_DSN", "u:p@tcp(127.0.0.1:3306)/tollgate")
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
	t.Setenv("UPSTREAM_URL", "http://127.0.0.1:9999")
	cfg, err := Load("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for model, kind := range map[string]string{"fake-claude": "anthropic", "fake-gpt": "openai"} {
		u, ok := cfg.UpstreamFor(model)
		if !ok || u.Kind != kind || u.BaseURL != "http://127.0.0.1:9999" {
			t.Errorf("%s goes to %+v (found %v), want the %s upstream at UPSTREAM_URL", model, u, ok, kind)
		}
	}
}

// An upstream that names its own key (api_key_env) keeps it when UPSTREAM_API_KEY, the first
// upstream's key, is set: two accounts at one provider share a base_url.
func TestUpstreamAPIKeyDoesNotOverrideAnotherUpstreamsKeyEnv(t *testing.T) {
	c := Default()
	c.Upstreams = []Upstream{
		{Name: "cheap", Kind: "openai", BaseURL: "https://api.openai.com/v1", APIKeyEnv: "KEY_A", Models: []string{"a"}},
		{Name: "dear", Kind: "openai", BaseURL: "https://api.openai.com/v1", APIKeyEnv: "KEY_B", Models: []string{"b"}},
	}
	env := map[string]string{"UPSTREAM_API_KEY": "sk-first", "KEY_A": "sk-a", "KEY_B": "sk-b"}
	c.applyEnv(func(k string) string { return env[k] })
	if got := c.Upstreams[1].APIKey; got != "sk-b" {
		t.Errorf("second upstream's key = %q, want %q from its api_key_env KEY_B", got, "sk-b")
	}
}

// TestBodyMemoryBoundsFitEveryBodyLimit: unset, the bounds on bodies in memory derive from
// max_body_bytes, so a configuration that was valid before they existed (any max_body_bytes up
// to 1 GiB) still starts; a caller's share is a 16th of the process's, and never less than one
// body. Fixed defaults (128 MiB a caller) refused every max_body_bytes above them.
func TestBodyMemoryBoundsFitEveryBodyLimit(t *testing.T) {
	for _, tc := range []struct {
		bodyBytes, total, perCaller int64
	}{
		{4 << 20, 512 << 20, 32 << 20},
		{64 << 20, 512 << 20, 64 << 20},
		{256 << 20, 1 << 30, 256 << 20},
		{1 << 30, 4 << 30, 1 << 30},
	} {
		cfg := Default()
		cfg.MySQLDSN, cfg.RedisURL = "u:p@tcp(127.0.0.1:3306)/db", "redis://127.0.0.1:6379/0"
		cfg.Limits.MaxBodyBytes = tc.bodyBytes
		cfg.Limits.MaxEventBytes = int(2 * tc.bodyBytes)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("max_body_bytes %d: %v", tc.bodyBytes, err)
		}
		if total, perCaller := cfg.Limits.BodyMemoryBounds(); total != tc.total || perCaller != tc.perCaller {
			t.Errorf("max_body_bytes %d: bounds %d, %d a caller; want %d, %d", tc.bodyBytes, total, perCaller, tc.total, tc.perCaller)
		}
	}
}

// TestResponseMemoryBoundFitsEveryAnswerLimit: unset, the bound on whole answers in memory is
// 512 MiB, or four largest answers when max_response_bytes is large, so that a configuration
// valid before it existed (any max_response_bytes up to 1 GiB) still starts, and a caller's
// share a 16th of it, or one largest answer if more; set, each is what was set.
func TestResponseMemoryBoundFitsEveryAnswerLimit(t *testing.T) {
	for _, tc := range []struct {
		answerBytes, set, setPerCaller, want, wantPerCaller int64
	}{
		{32 << 20, 0, 0, 512 << 20, 32 << 20},
		{1 << 20, 0, 0, 512 << 20, 32 << 20},
		{256 << 20, 0, 0, 1 << 30, 256 << 20},
		{1 << 30, 0, 0, 4 << 30, 1 << 30},
		{32 << 20, 64 << 20, 0, 64 << 20, 32 << 20},
		{32 << 20, 0, 100 << 20, 512 << 20, 100 << 20},
	} {
		cfg := Default()
		cfg.MySQLDSN, cfg.RedisURL = "u:p@tcp(127.0.0.1:3306)/db", "redis://127.0.0.1:6379/0"
		cfg.Limits.MaxResponseBytes, cfg.Limits.MaxResponseMemory, cfg.Limits.MaxResponseMemoryPerCaller = tc.answerBytes, tc.set, tc.setPerCaller
		if err := cfg.Validate(); err != nil {
			t.Fatalf("max_response_bytes %d, max_response_memory %d: %v", tc.answerBytes, tc.set, err)
		}
		if got, perCaller := cfg.Limits.ResponseMemoryBound(), cfg.Limits.ResponseMemoryPerCaller(); got != tc.want || perCaller != tc.wantPerCaller {
			t.Errorf("max_response_bytes %d, max_response_memory %d, per caller %d: bounds %d, %d a caller; want %d, %d",
				tc.answerBytes, tc.set, tc.setPerCaller, got, perCaller, tc.want, tc.wantPerCaller)
		}
	}
}

// TestDeadInstanceBoundFitsTheHeartbeat: left 0, the dead-instance bound is 90 s, or the least
// the heartbeat settings allow when that is more, so that a configuration with slow heartbeats
// written before the bound existed still starts; set, it is what was set.
func TestDeadInstanceBoundFitsTheHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		lease, beat, set, want time.Duration
	}{
		{30 * time.Second, 10 * time.Second, 0, 90 * time.Second},
		{120 * time.Second, 30 * time.Second, 0, 180 * time.Second},
		{60 * time.Second, 30 * time.Second, 0, 120 * time.Second},
		{30 * time.Second, 10 * time.Second, 50 * time.Second, 50 * time.Second},
	} {
		cfg := Default()
		cfg.MySQLDSN, cfg.RedisURL = "u:p@tcp(127.0.0.1:3306)/db", "redis://127.0.0.1:6379/0"
		cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, cfg.Holds.DeadInstanceAfter = tc.lease, tc.beat, tc.set
		if err := cfg.Validate(); err != nil {
			t.Fatalf("lease %v heartbeat %v bound %v: %v", tc.lease, tc.beat, tc.set, err)
		}
		if got := cfg.Holds.DeadInstanceBound(); got != tc.want {
			t.Errorf("lease %v heartbeat %v bound %v: in force %v, want %v", tc.lease, tc.beat, tc.set, got, tc.want)
		}
	}
}

// TestBadModelsAreNamedInOrder: a start refused for several models' prices names them in the
// order of their names, the same each time (the models were read from a map, in Go's random
// order: the same file refused in different words from one start to the next).
func TestBadModelsAreNamedInOrder(t *testing.T) {
	names := []string{"m-a", "m-b", "m-c", "m-d", "m-e", "m-f", "m-g"}
	body := "mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\nmodels:\n"
	for _, n := range names {
		body += "  " + n + ":\n    input: 1\n    max_output_tokens: -1\n"
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil {
		t.Fatal("negative max_output_tokens accepted")
	}
	last := -1
	for _, n := range names {
		at := strings.Index(err.Error(), "models."+n+".max_output_tokens")
		if at < 0 {
			t.Fatalf("%s not named: %v", n, err)
		}
		if at < last {
			t.Fatalf("models named out of order: %v", err)
		}
		last = at
	}
}

// README "Configuration" names each environment variable and the setting it sets; each one
// must override the file, and TOLLGATE_INSTANCE default to host:pid.
func TestEveryREADMEVariableOverridesItsSetting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("mysql_dsn: f@tcp(h:1)/d\nredis_url: redis://file:1/0\nlisten_addr: 127.0.0.1:1\n"+
		"admin_token: file-token-0123456789\ninstance: from-file\nredis_key_prefix: file-\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MYSQL_DSN": "e@tcp(h:2)/d", "REDIS_URL": "redis://env:2/0", "LISTEN_ADDR": "127.0.0.1:2",
		"ADMIN_TOKEN": "env-token-0123456789", "TOLLGATE_INSTANCE": "from-env", "TOLLGATE_REDIS_PREFIX": "env-",
		"UPSTREAM_URL": "http://127.0.0.1:3", "UPSTREAM_API_KEY": "sk-env"}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{"MYSQL_DSN": cfg.MySQLDSN, "REDIS_URL": cfg.RedisURL, "LISTEN_ADDR": cfg.ListenAddr,
		"ADMIN_TOKEN": cfg.AdminToken, "TOLLGATE_INSTANCE": cfg.Instance, "TOLLGATE_REDIS_PREFIX": cfg.RedisKeyPrefix,
		"UPSTREAM_URL": cfg.Upstreams[0].BaseURL, "UPSTREAM_API_KEY": cfg.Upstreams[0].APIKey}
	for k, want := range env {
		if got[k] != want {
			t.Errorf("%s: the setting is %q, want the variable's %q", k, got[k], want)
		}
	}

	t.Setenv("TOLLGATE_INSTANCE", "")
	if cfg, err = Load(""); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if want := host + ":" + strconv.Itoa(os.Getpid()); cfg.Instance != want {
		t.Errorf("instance without a setting: %q, want host:pid %q", cfg.Instance, want)
	}
}

// README "Configuration": a request goes to the first upstream that serves its model by exact
// name, then by "prefix*", then by "*" — an exact name in a later upstream wins over a prefix
// or "*" in an earlier one, and among prefixes (or stars) the first upstream in the list wins.
func TestUpstreamForTakesExactThenPrefixThenStar(t *testing.T) {
	c := Default()
	c.Upstreams = []Upstream{
		{Name: "star", Kind: "openai", BaseURL: "http://a", Models: []string{"*"}},
		{Name: "wide", Kind: "openai", BaseURL: "http://b", Models: []string{"gpt-*"}},
		{Name: "narrow", Kind: "openai", BaseURL: "http://c", Models: []string{"gpt-4o*"}},
		{Name: "exact", Kind: "anthropic", BaseURL: "http://d", Models: []string{"gpt-4o-mini"}},
		{Name: "star-too", Kind: "openai", BaseURL: "http://e", Models: []string{"*"}},
	}
	for model, want := range map[string]string{
		"gpt-4o-mini":  "exact", // by exact name, though three upstreams before it match
		"gpt-4o":       "wide",  // the first prefix, not the longest
		"gpt-5":        "wide",  // a prefix before "*"
		"claude-x":     "star",  // "*": the first that has it
		"gpt-":         "wide",  // a prefix matches its own text
		"gpt":          "star",  // shorter than the prefix: "*"
		"gpt-4o-mini2": "wide",  // the exact name is no prefix
	} {
		u, ok := c.UpstreamFor(model)
		if !ok || u.Name != want {
			t.Errorf("%s goes to %+v (found %v), want %s", model, u, ok, want)
		}
	}
	c.Upstreams = c.Upstreams[1:4]
	if u, ok := c.UpstreamFor("claude-x"); ok {
		t.Errorf("claude-x goes to %s with no upstream serving it", u.Name)
	}
}

// TestRedisClusterSettings: redis_cluster (REDIS_CLUSTER) reads redis_url as a Cluster's seed
// nodes (its host and addr= parameters, go-redis's ParseClusterURL). A Cluster has database 0
// only, and a key prefix with a brace would put every key's hash tag in the prefix: one slot
// for the whole fleet's keys, or, with an unclosed brace, the keys of one run in several. A
// URL naming more nodes without redis_cluster is a Cluster the gateway would open as one server.
func TestRedisClusterSettings(t *testing.T) {
	for _, tc := range []struct {
		yaml, url, cluster, want string // want "" loads
	}{
		{"redis_cluster: true\n", "redis://h:1?addr=h:2&addr=h:3", "", ""},
		{"", "redis://h:1/0?addr=h:2", "true", ""},
		{"redis_cluster: true\n", "redis://h:1/1", "", "database 1"},
		{"", "redis://h:1/0?addr=h:2", "", "redis_cluster"},
		{"redis_cluster: true\nredis_key_prefix: 'a{b}:'\n", "redis://h:1", "", "redis_key_prefix"},
		{"redis_cluster: true\nredis_key_prefix: 'a}:'\n", "redis://h:1", "", "redis_key_prefix"},
		{"redis_key_prefix: 'a{b}:'\n", "redis://h:1", "", ""}, // one server: no slots
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte("mysql_dsn: x@tcp(h:1)/d\n"+tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("REDIS_URL", tc.url)
		t.Setenv("REDIS_CLUSTER", tc.cluster)
		t.Setenv("MYSQL_DSN", "")
		cfg, err := Load(path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q %s: %v", tc.yaml, tc.url, err)
		case tc.want == "" && !cfg.RedisCluster && (strings.Contains(tc.yaml, "redis_cluster") || tc.cluster != ""):
			t.Errorf("%q %s REDIS_CLUSTER=%q: not a cluster", tc.yaml, tc.url, tc.cluster)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q %s: error %v, want it to name %q", tc.yaml, tc.url, err, tc.want)
		}
	}
}
