package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestLongContextCallsAreBilledAtTheLongPrice: a model with a long_context price (Gemini 2.5
// Pro, Claude's 1M-context beta past 200 000 prompt tokens) is billed at it — every token of
// the call, output included — when the reported prompt passes its line, and at its short
// price up to the line; in every wire format, streamed or not. Billed at the short price, each
// long call cost the operator about twice its charge. Claude's context-1m beta, refused on a
// model without a long-context price (unpriced_option), is served on one with it.
func TestLongContextCallsAreBilledAtTheLongPrice(t *testing.T) {
	const shortIn, shortOut, longIn, longOut = 100_000, 1_000_000, 200_000, 2_000_000 // µUSD per million
	priced := config.ModelCfg{Input: config.USDPerM{Micro: shortIn}, CacheRead: config.USDPerM{Micro: shortIn},
		CacheWrite: config.USDPerM{Micro: shortIn}, Output: config.USDPerM{Micro: shortOut},
		LongContext: config.LongContextCfg{AbovePromptTokens: 200_000, Input: config.USDPerM{Micro: longIn},
			CacheRead: config.USDPerM{Micro: longIn}, CacheWrite: config.USDPerM{Micro: longIn}, Output: config.USDPerM{Micro: longOut}}}
	h := newHarness(t, func(c *config.Config) {
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		c.Models["gemini-long"] = priced
		c.Models["claude-long"] = priced
	})
	u, key := h.user("standard")
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		prompt           int64
		long             bool
	}{
		{"chat at the line", "/v1/chat/completions", `{"model":"gemini-long","messages":[{"role":"user","content":"hi"}]}`, nil, 200_000, false},
		{"chat past the line", "/v1/chat/completions", `{"model":"gemini-long","messages":[{"role":"user","content":"hi"}]}`, nil, 200_001, true},
		{"chat stream past the line", "/v1/chat/completions", `{"model":"gemini-long","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil, 350_000, true},
		{"responses past the line", "/v1/responses", `{"model":"gemini-long","input":"hi"}`, nil, 250_000, true},
		{"messages with the 1m beta, past the line", "/v1/messages", `{"model":"claude-long","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}, 600_000, true},
		{"messages with the 1m beta, under the line", "/v1/messages", `{"model":"claude-long","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}, 150_000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{fakellm.HeaderPromptTokens: fmt.Sprint(tc.prompt)}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			r, answer := h.answeredRun(u.ID, key, tc.path, tc.body, hdr)
			in, out := int64(shortIn), int64(shortOut)
			if tc.long {
				in, out = longIn, longOut
			}
			want := (r.InTok*in + r.OutTok*out + 999_999) / 1_000_000
			if r.InTok+r.CacheReadTok+r.CacheWriteTok != tc.prompt || r.OutTok == 0 || r.Estimated || r.CostMicro != want || r.ChargedMicro != want {
				t.Fatalf("run %+v (answer %s): want a prompt of %d, output, and cost and charge %d", r, answer, tc.prompt, want)
			}
		})
	}
	h.postRefused(t, key, "/v1/messages", `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}, http.StatusBadRequest, "unpriced_option")
}
