package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/pricing"
)

// TestOneHourCacheWritesAnsweredByAModelWithoutTheirPrice: a call that caches its prompt for
// an hour, on a model with a one-hour write price, may be answered by another model priced on
// its own (a dated snapshot the operator priced apart, the one-hour price forgotten). Billed
// at that model's price, the one-hour writes paid its five-minute rate, the provider charging
// the one-hour one. They are billed at the dearer of the two prices, as lacksPartPrice says.
func TestOneHourCacheWritesAnsweredByAModelWithoutTheirPrice(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-hour-20250929","content":[{"type":"text","text":"ok"}],
"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"cache_read_input_tokens":0,"cache_creation_input_tokens":50000,
"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":50000},"output_tokens":10}}`)
	}))
	t.Cleanup(up.Close)
	const in, out = 3_000_000, 15_000_000
	asked := config.ModelCfg{Input: config.USDPerM{Micro: in}, CacheRead: config.USDPerM{Micro: in / 10},
		CacheWrite: config.USDPerM{Micro: in * 5 / 4}, CacheWrite1h: config.USDPerM{Micro: 2 * in}, Output: config.USDPerM{Micro: out}}
	answered := asked
	answered.CacheWrite1h = config.USDPerM{} // priced apart, the one-hour price forgotten
	var askedPrice, answeredPrice pricing.Price
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: up.URL, Models: []string{"claude*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		c.Models["claude-hour"] = asked
		c.Models["claude-hour-20250929"] = answered
		table, err := c.PriceTable()
		if err != nil {
			t.Fatal(err)
		}
		askedPrice, _, _ = table.Lookup("claude-hour")
		answeredPrice, _, _ = table.Lookup("claude-hour-20250929")
	})
	u, key := h.user("standard")
	run, answer := h.answeredRun(u.ID, key, "/v1/messages", `{"model":"claude-hour","max_tokens":50,
		"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],
		"messages":[{"role":"user","content":"hi"}]}`, nil)
	used := pricing.Usage{Input: 3, CacheWrite: 50000, CacheWrite1h: 50000, Output: 10}
	want := answeredPrice.Dearest(askedPrice).Cost(used)
	if run.CostMicro != want {
		t.Errorf("run %+v (answer %s): cost %d µUSD, want %d, the one-hour writes at %d µUSD/M", run, answer, run.CostMicro, want, askedPrice.CacheWrite1h)
	}
	if short := answeredPrice.Cost(used); run.CostMicro <= short {
		t.Errorf("cost %d µUSD, no more than the answering model's five-minute rates give (%d)", run.CostMicro, short)
	}
}
