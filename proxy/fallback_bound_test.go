package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestFallbackModelsBoundTheOutputAtTheDearestPrice: a router answers with a fallback of its
// `models` list at that model's rates, and the call is billed at them; the output bound that
// keeps a call's worst case within its cap must then be reckoned at the dearest model the
// router may answer with. Reckoned at the asked model's price, a cheap model falling back to
// one eight times dearer could cost eight times the cap, the charge clamped to the cap and the
// rest paid by the operator.
func TestFallbackModelsBoundTheOutputAtTheDearestPrice(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.Output = config.USDPerM{Micro: 8 * m.Output.Micro}
		c.Models["dear-gpt"] = m
	})
	_, key := h.user("standard")
	// The default cap, 500 000 µUSD, pays for 50 000 output tokens of fake-gpt (10 µUSD each)
	// and 6 250 of dear-gpt (80 µUSD).
	const capCheap, capDear = 50_000, 6_250
	sent := func(body string) int64 {
		t.Helper()
		resp := h.post(key, "/v1/chat/completions", body, nil)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return up.last(t).Get("max_tokens").Int()
	}
	if got := sent(`{"model":"fake-gpt","models":["fake-gpt","dear-gpt"],"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`); got > capDear {
		t.Fatalf("upstream got max_tokens=%d with dear-gpt as a fallback: at its price the cap pays for %d", got, capDear)
	}
	if got := sent(`{"model":"fake-gpt","models":["fake-gpt"],"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`); got <= capDear || got > capCheap {
		t.Fatalf("upstream got max_tokens=%d with no dearer fallback, want within (%d, %d]", got, capDear, capCheap)
	}
}
