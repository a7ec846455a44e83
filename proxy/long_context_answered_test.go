package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestContext1MAnsweredByAModelWithoutLongPrice: a call with the context-1m beta is served on
// a model with a long-context price, but the answer may name another model priced on its own
// (an alias answered by a dated snapshot the operator priced apart, without the block). Billed
// at that model's one price, a prompt past 200 k paid its short rates, the provider charging
// its long ones: half of every token. Such an answer has no price for what the call asked, so
// it is billed at the dearer of its price and the one asked for, long rates past the line; an
// answer under the line, or from a model with its own long-context price, at its own.
func TestContext1MAnsweredByAModelWithoutLongPrice(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%s,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10}}`,
			r.Header.Get("X-Answer"), r.Header.Get("X-Prompt"))
	}))
	t.Cleanup(up.Close)
	const shortIn, shortOut, longIn, longOut = 3_000_000, 15_000_000, 6_000_000, 22_500_000
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: up.URL, Models: []string{"claude*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		short := config.ModelCfg{Input: config.USDPerM{Micro: shortIn}, CacheRead: config.USDPerM{Micro: shortIn},
			CacheWrite: config.USDPerM{Micro: shortIn}, Output: config.USDPerM{Micro: shortOut}}
		long := short
		long.LongContext = config.LongContextCfg{AbovePromptTokens: 200_000, Input: config.USDPerM{Micro: longIn},
			CacheRead: config.USDPerM{Micro: longIn}, CacheWrite: config.USDPerM{Micro: longIn}, Output: config.USDPerM{Micro: longOut}}
		c.Models["claude-sonnet-x"] = long
		c.Models["claude-sonnet-x-20250929"] = short // priced apart, the block forgotten
		c.Models["claude-sonnet-x-20251001"] = long
	})
	u, key := h.user("standard")
	beta := map[string]string{"Anthropic-Beta": "context-1m-2025-08-07"}
	for _, tc := range []struct {
		answer, prompt string
		in, out        int64
	}{
		{"claude-sonnet-x-20250929", "600000", longIn, longOut},
		{"claude-sonnet-x-20250929", "150000", shortIn, shortOut},
		{"claude-sonnet-x-20251001", "600000", longIn, longOut},
		{"claude-sonnet-x", "600000", longIn, longOut},
	} {
		hdr := map[string]string{"X-Answer": tc.answer, "X-Prompt": tc.prompt}
		for k, v := range beta {
			hdr[k] = v
		}
		r, answer := h.answeredRun(u.ID, key, "/v1/messages", `{"model":"claude-sonnet-x","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`, hdr)
		if want := (r.InTok*tc.in + r.OutTok*tc.out + 999_999) / 1_000_000; r.InTok == 0 || r.CostMicro != want {
			t.Errorf("answered by %s with a prompt of %s: run %+v (answer %s), want cost %d", tc.answer, tc.prompt, r, answer, want)
		}
	}
}
