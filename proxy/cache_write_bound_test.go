package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestCallWritingItsPromptToCacheIsBoundWithinItsCap: a /v1/messages call that marks its prompt
// with cache_control (Claude Code marks its system prompt and last turn on every call) is
// billed its prompt at the cache-write price when the provider writes it — 1.25× the input
// price for five minutes, 2× for an hour — not at the input price. Its output bound was
// reckoned with the prompt at the input price, so a call whose cap binds (a named run near its
// budget, a user near the end of the balance) cost more than its cap: the charge is clamped
// to the cap and the operator paid the provider the rest. The bound now prices a prompt marked
// for the cache at the write price it may be billed at.
func TestCallWritingItsPromptToCacheIsBoundWithinItsCap(t *testing.T) {
	for _, tc := range []struct{ name, ttl, runID string }{
		{"five-minute write, named run", "5m", "agent-cache-5m"},
		{"one-hour write, named run", "1h", "agent-cache-1h"},
		{"one-hour write, one call", "1h", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &agentUpstream{}
			h, price := agentHarness(t, up, func(c *config.Config) {
				p := c.Plans["standard"]
				p.MaxRunCostCredits = config.CreditsOf(60)
				c.Plans["standard"] = p
			})
			u, key := h.user("standard")
			body := `{"model":"claude-test","max_tokens":10000,"stream":true,
				"system":[{"type":"text","text":"` + strings.Repeat("You are a careful coding agent. ", 1300) +
				`","cache_control":{"type":"ephemeral","ttl":"` + tc.ttl + `"}}],
				"messages":[{"role":"user","content":"fix the bug"}]}`
			est, _ := metering.EstimatePrompt(metering.FormatAnthropic, []byte(body))
			// The provider writes the whole prompt to the cache, as on an agent's first turn,
			// and answers as long as it is allowed to.
			tr := turn{out: 10000}
			if tc.ttl == "1h" {
				tr.w1 = est
			} else {
				tr.w5 = est
			}
			hdr := tr.headers(tc.runID)
			if tc.runID == "" {
				delete(hdr, "X-Run-Id")
			}
			resp, answer := h.postOK(t, key, "/v1/messages", body, hdr)
			for line := range strings.SplitSeq(string(answer), "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(d, "type").Str == "message_delta" {
					tr.out = gjson.Get(d, "usage.output_tokens").Int()
				}
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			if tc.runID != "" {
				if status, b := h.settleRun(key, tc.runID); status != http.StatusOK {
					t.Fatalf("settle: %d %s", status, b)
				}
			}
			r := h.run(u.ID, runID)
			cost := price.Cost(tr.usage())
			if r.CostMicro != cost {
				t.Fatalf("run cost %d, want %d", r.CostMicro, cost)
			}
			if cost > r.CapMicro {
				t.Fatalf("the call cost %d µUSD (%d tokens written to the cache at %s, %d output): past its cap %d, "+
					"charged %d; the operator paid the provider %d µUSD nobody was charged", cost, est, tc.ttl, tr.out,
					r.CapMicro, r.ChargedMicro, cost-r.ChargedMicro)
			}
			if least := price.Cost(pricing.Usage{CacheWrite: est, CacheWrite1h: tr.w1, Output: tr.out + 1}); least <= r.CapMicro {
				t.Fatalf("output bound %d leaves room for more: %d µUSD with one token more, cap %d", tr.out, least, r.CapMicro)
			}
			t.Logf("prompt %d tokens, output %s", est, strconv.FormatInt(tr.out, 10))
		})
	}
}
