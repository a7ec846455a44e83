package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestContext1MRefusedWithAFallbackWithoutLongPrice: with Anthropic's context-1m beta a prompt
// may pass 200 000 tokens, which the provider bills at its long-context rates. A router's
// fallback (`models`) answers at its own price; one without a long_context price was billed
// such a call at its short rates — half what the provider charged for every token — since the
// beta was checked against the model asked for alone. The request is refused
// (unpriced_option) as it is when the model asked for has no long-context price; a list whose
// models all have one is served, and so is the list without the beta (no prompt passes 200 k).
func TestContext1MRefusedWithAFallbackWithoutLongPrice(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		short := c.Models["fake-gpt"]
		long := short
		long.LongContext = config.LongContextCfg{AbovePromptTokens: 200_000, Input: config.USDPerM{Micro: 2 * short.Input.Micro},
			CacheRead: short.CacheRead, CacheWrite: short.CacheWrite, Output: config.USDPerM{Micro: 2 * short.Output.Micro}}
		c.Models["claude-long"], c.Models["claude-long-too"], c.Models["claude-short"] = long, long, short
	})
	_, key := h.user("standard")
	beta := map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}
	h.postRefused(t, key, "/v1/messages",
		`{"model":"claude-long","models":["claude-long","claude-short"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		beta, http.StatusBadRequest, "unpriced_option")
	for _, tc := range []struct {
		body string
		hdr  map[string]string
	}{
		{`{"model":"claude-long","models":["claude-long","claude-long-too"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, beta},
		{`{"model":"claude-long","models":["claude-long","claude-short"],"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, nil},
	} {
		resp := h.post(key, "/v1/messages", tc.body, tc.hdr)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s (%v): %d %s, want 200", tc.body, tc.hdr, resp.StatusCode, out)
		}
	}
}
