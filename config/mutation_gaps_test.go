package config

import (
	"strings"
	"testing"
	"time"
)

// TestMoreBoundsAreCheckedAtTheirEdges extends TestMoneyBoundsAreCheckedAtTheirEdges to the
// bounds a mutation review of validate.go found unchecked at their edges or not at all: a DEL
// in admin_token, credit_micro's wording and its exact-decimal rule, the ten-year ceiling,
// heartbeat_interval against lease_ttl and against run_ttl (not hold_ttl alone),
// max_body_bytes' floor, the replay record's overhead in a caller's replay bytes, a negative
// allowance, port 65536, two upstreams of one name, an api_key_env starting with a digit, no upstream, no price,
// an upstream of no kind, a base_url ending in a bare '?' and an empty listen_addr. says, when set, is a part of
// the refusal's words that must be there too.
func TestMoreBoundsAreCheckedAtTheirEdges(t *testing.T) {
	plan := func(set func(p *Plan)) func(c *Config) {
		return func(c *Config) {
			p := c.Plans["standard"]
			set(&p)
			c.Plans["standard"] = p
		}
	}
	replayLen := Default().Dedup.MaxReplayLen
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // the setting named in the refusal; "" when it must be accepted
		says string
	}{
		{"admin token with a DEL", func(c *Config) { c.AdminToken = "admin-token-0123\x7f" }, "admin_token (ADMIN_TOKEN)", ""},
		{"credit_micro 0", func(c *Config) { c.CreditMicro = 0 }, "credit_micro", "must be positive"},
		{"credit_micro 3000", func(c *Config) { c.CreditMicro = 3000 }, "credit_micro", "product of 2s and 5s"},
		{"credit_micro 5000", func(c *Config) { c.CreditMicro = 5000 }, "", ""},
		{"replay_ttl ten years", func(c *Config) { c.Dedup.ReplayTTL = maxDuration }, "", ""},
		{"replay_ttl ten years and 1ns", func(c *Config) { c.Dedup.ReplayTTL = maxDuration + 1 }, "dedup.replay_ttl", "ten years"},
		// heartbeat_interval is 10s by default.
		{"lease_ttl 1ns under two heartbeats", func(c *Config) { c.Holds.LeaseTTL = 20*time.Second - 1 }, "holds.heartbeat_interval", "lease_ttl"},
		{"lease_ttl two heartbeats", func(c *Config) { c.Holds.LeaseTTL = 20 * time.Second }, "", ""},
		{"heartbeat over half of run_ttl", func(c *Config) { c.Holds.RunTTL = 19 * time.Second }, "holds.heartbeat_interval", "run_ttl"},
		{"max_body_bytes 1023", func(c *Config) { c.Limits.MaxBodyBytes = 1023 }, "limits.max_body_bytes", ""},
		{"max_body_bytes 1024", func(c *Config) { c.Limits.MaxBodyBytes = 1024 }, "", ""},
		{"replay bytes a caller under one answer and its record", func(c *Config) {
			c.Dedup.MaxReplayBytesPerCaller = replayLen + ReplayRecordOverhead - 1
		}, "dedup.max_replay_bytes_per_caller", ""},
		{"replay bytes a caller of one answer and its record", func(c *Config) {
			c.Dedup.MaxReplayBytesPerCaller = replayLen + ReplayRecordOverhead
		}, "", ""},
		{"allowance -0.001", plan(func(p *Plan) { p.AllowanceCredits = Credits{Milli: -1} }), "plans.standard.allowance_credits", ""},
		{"base_url port 65536", func(c *Config) { c.Upstreams[0].BaseURL = "http://llm.internal:65536" }, "upstreams[0].base_url", "port"},
		{"two upstreams of one name", func(c *Config) {
			u := c.Upstreams[0]
			u.Models = []string{"fake-gpt"}
			c.Upstreams = append(c.Upstreams, u)
		}, "upstreams[1].name", "unique"},
		{"no upstream", func(c *Config) { c.Upstreams = nil }, "upstreams", "no upstream configured"},
		{"no model priced", func(c *Config) { c.Models = map[string]ModelCfg{} }, "models", "no model priced"},
		{"upstream of no kind", func(c *Config) { c.Upstreams[0].Kind = "" }, "upstreams[0].kind", "openai or anthropic"},
		{"base_url with an empty query", func(c *Config) { c.Upstreams[0].BaseURL = "https://llm.internal/?" }, "upstreams[0].base_url", "has a query"},
		{"listen_addr empty", func(c *Config) { c.ListenAddr = "" }, "listen_addr (LISTEN_ADDR)", "is empty"},
		{"api_key_env starting with a digit", func(c *Config) {
			c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "1KEY", "sk-set"
		}, "upstreams[0].api_key_env", "not an environment variable name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
			c.RedisURL = "redis://127.0.0.1:6379/0"
			tc.set(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused at the edge: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted; want %s refused", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want+":"):
				t.Fatalf("error %q does not name %s", err, tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.says):
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

// Credits become micro-USD rounded up, so a plan's hold or cap is never less than written: at
// a credit_micro that is not a multiple of 1000, a thousandth of a credit is a fraction of a
// micro-USD.
func TestCreditsMicroAtRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		milli, creditMicro, want int64
	}{
		{1, 1, 1}, {999, 1, 1}, {1000, 1, 1}, {1001, 1, 2}, {1, 500, 1}, {3, 500, 2}, {1500, 1000, 1500},
	} {
		if got := (Credits{Milli: tc.milli}).MicroAt(tc.creditMicro); got != tc.want {
			t.Errorf("%d thousandths of a credit at %d µUSD a credit = %d µUSD, want %d", tc.milli, tc.creditMicro, got, tc.want)
		}
	}
}

// parseDecimal reads every price and plan amount: a number with no digits ("" quoted, ".") is
// not 0 (a free model nobody meant), and one past what int64 holds scaled is refused, not
// wrapped to another amount.
func TestParseDecimalRefusesNoDigitsAndOverflow(t *testing.T) {
	for _, s := range []string{"", ".", " . ", "9223372036854775808", "99999999999999999999"} {
		if v, err := parseDecimal(s, 0); err == nil {
			t.Errorf("parseDecimal(%q, 0) = %d, want an error", s, v)
		}
	}
	if v, err := parseDecimal("9999999999999999", 3); err == nil {
		t.Errorf("parseDecimal of 10^16 credits in thousandths = %d, want an error", v)
	}
	for s, want := range map[string]int64{"0": 0, "0.5": 500, "12.345": 12_345, ".5": 500, "7.": 7000} {
		if v, err := parseDecimal(s, 3); err != nil || v != want {
			t.Errorf("parseDecimal(%q, 3) = %d, %v; want %d", s, v, err, want)
		}
	}
	_, err := loadYAML(t, "models:\n  m:\n    input: \".\"\n    output: 1\nupstreams:\n  - name: a\n    kind: openai\n    base_url: http://llm.internal\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "empty number") {
		t.Errorf("a price of \".\": error %v, want it refused as an empty number", err)
	}
}

// An upstream at the first's base_url that names the same api_key_env as the first takes
// UPSTREAM_API_KEY, as the first does: the README's "shares the first's key when it names the
// same variable or none". Taking the variable instead would send two keys to one account.
func TestUpstreamAPIKeyAppliesToAnUpstreamNamingTheFirstsVariable(t *testing.T) {
	c := Default()
	c.Upstreams = []Upstream{
		{Name: "chat", Kind: "openai", BaseURL: "https://llm.internal", APIKeyEnv: "OPENAI_API_KEY", Models: []string{"a"}},
		{Name: "messages", Kind: "anthropic", BaseURL: "https://llm.internal", APIKeyEnv: "OPENAI_API_KEY", Models: []string{"b"}},
		{Name: "none", Kind: "openai", BaseURL: "https://llm.internal", Models: []string{"c"}},
	}
	env := map[string]string{"UPSTREAM_API_KEY": "sk-override", "OPENAI_API_KEY": "sk-file"}
	c.applyEnv(func(k string) string { return env[k] })
	for i, u := range c.Upstreams {
		if u.APIKey != "sk-override" {
			t.Errorf("upstreams[%d] (%s) key = %q, want UPSTREAM_API_KEY's %q", i, u.Name, u.APIKey, "sk-override")
		}
	}
}

// The warnings' edges: a hold as long as the longest call is enough, one a nanosecond shorter
// is not; a header_timeout equal to upstream_timeout never fires either.
func TestWarningsAtTheirEdges(t *testing.T) {
	c := Default()
	longest := c.Limits.UpstreamTimeout + c.Limits.ClientWriteTimeout
	c.Holds.HoldTTL = longest
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("hold_ttl of the longest call: warnings %v, want none", w)
	}
	c.Holds.HoldTTL = longest - 1
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "holds.hold_ttl") {
		t.Errorf("hold_ttl 1ns short of the longest call: warnings %v, want one naming holds.hold_ttl", w)
	}
	c = Default()
	c.Limits.HeaderTimeout = c.Limits.UpstreamTimeout
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "limits.header_timeout") {
		t.Errorf("header_timeout equal to upstream_timeout: warnings %v, want one naming limits.header_timeout", w)
	}
}

// names matches a pattern's * against one part of one key only, and never a field shorter
// than the pattern's two ends: hold_*_credits does not name hold_credits, whose "hold_" and
// "_credits" overlap.
func TestNamesMatchesAStarWithinOneKey(t *testing.T) {
	for _, tc := range []struct {
		setting, field string
		want           bool
	}{
		{"plans.x.hold_*_credits", "plans.x.hold_normal_credits", true},
		{"plans.x.hold_*_credits", "plans.x.hold__credits", true},
		{"plans.x.hold_*_credits", "plans.x.hold_credits", false},
		{"plans.x.hold_*_credits", "plans.x.hold_a.b_credits", false},
		{"plans.x.max_in_flight", "plans.x.max_in_flight", true},
	} {
		if got := names(tc.setting, tc.field); got != tc.want {
			t.Errorf("names(%q, %q) = %v, want %v", tc.setting, tc.field, got, tc.want)
		}
	}
}
