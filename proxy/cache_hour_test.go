package proxy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestOneHourCacheWritesChargedAtTheirPrice: a /v1/messages call that caches its prompt for an
// hour, on a model priced for it, is served and charged its one-hour writes at the one-hour
// price (Anthropic's answer breaks cache_creation_input_tokens into cache_creation's
// five-minute and one-hour parts). Charged at the five-minute price, the writes cost the
// operator 60 % more than the caller paid for them.
func TestOneHourCacheWritesChargedAtTheirPrice(t *testing.T) {
	// The recorded answer of the shared fixtures, its writes made one-hour ones.
	dir := t.TempDir()
	const fixture = "anthropic_one_hour_cache.json"
	answer := `{"content":[{"text":"Python is versatile.","type":"text"}],"id":"msg_01","model":"claude-test",
"role":"assistant","stop_reason":"end_turn","stop_sequence":null,"type":"message",
"usage":{"cache_creation":{"ephemeral_1h_input_tokens":400,"ephemeral_5m_input_tokens":18},"cache_creation_input_tokens":418,
"cache_read_input_tokens":1111,"input_tokens":3,"output_tokens":33,"service_tier":"standard"}}`
	if err := os.WriteFile(filepath.Join(dir, fixture), []byte(answer), 0o600); err != nil {
		t.Fatal(err)
	}
	h, price := harnessRepricing(t, dir, "claude-test", func(m *config.ModelCfg) {
		m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
	})
	u, key := h.user("standard")
	// the model has a one-hour price
	resp, _ := h.postOK(t, key, "/v1/messages", `{"model":"claude-test","max_tokens":50,
		"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],
		"messages":[{"role":"user","content":"hi"}]}`, map[string]string{fakellm.HeaderReplay: fixture})
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	used := pricing.Usage{Input: 3, CacheRead: 1111, CacheWrite: 418, CacheWrite1h: 400, Output: 33}
	if want := price.Cost(used); run.CostMicro != want || run.ChargedMicro != want {
		t.Fatalf("run cost %d charged %d, want %d (the 400 one-hour writes at %d µUSD/M)", run.CostMicro, run.ChargedMicro, want, price.CacheWrite1h)
	}
	if short := price.Cost(pricing.Usage{Input: 3, CacheRead: 1111, CacheWrite: 418, Output: 33}); run.ChargedMicro <= short {
		t.Fatalf("charged %d, no more than at five-minute prices (%d)", run.ChargedMicro, short)
	}
	if run.CacheWriteTok != 418 {
		t.Fatalf("cache_write_tok %d, want 418 (both kinds)", run.CacheWriteTok)
	}
}

// harnessRepricing is a harness replaying answers from dir (the recorded fixtures when "")
// whose model's price reprice changes (and the rest of its configuration more); it returns the
// price the gateway then charges.
func harnessRepricing(t *testing.T, dir, model string, reprice func(*config.ModelCfg), more ...func(*config.Config)) (*harness, pricing.Price) {
	t.Helper()
	var price pricing.Price
	h := newHarnessWithFixtures(t, dir, func(c *config.Config) {
		for _, f := range more {
			f(c)
		}
		m := c.Models[model]
		reprice(&m)
		c.Models[model] = m
		table, err := c.PriceTable()
		if err != nil {
			t.Fatal(err)
		}
		price, _, _ = table.Lookup(model)
	})
	return h, price
}
