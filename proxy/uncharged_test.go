package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestCostPastTheCapIsCounted: a call's output bound is reckoned at the prices of the models
// that may answer it (the one asked for, its router fallbacks), but an upstream may answer with
// a dearer model the call did not name (a router's own pick, an alias moved to a dearer
// snapshot). The call is billed at that model's price, and its charge clamped to its cap (the
// caller's authorisation, DESIGN §3): what passed the cap was charged to no one, and nothing
// said so but the row's cost beside its charge. It is counted in
// tollgate_uncharged_micro_usd_total, by source, so that an operator sees what it paid.
func TestCostPastTheCapIsCounted(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"dear-2025-01-01","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":1000,"completion_tokens":100000,"total_tokens":101000}}`)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
		cheap := c.Models["fake-gpt"]
		cheap.Input.Micro, cheap.Output.Micro = 100_000, 100_000 // $0.10 per million
		c.Models["cheap"] = cheap
		c.Models["dear"] = c.Models["fake-gpt"] // $2.50 / $10 per million
	})
	u, key := h.user("standard")
	// The cap, 500 000 µUSD, pays for 5 M output tokens of cheap: the bound lets the answer's
	// 100 000 through, which at dear's price cost 1 002 500 µUSD.
	r, answer := h.answeredRun(u.ID, key, "/v1/chat/completions", `{"model":"cheap","messages":[{"role":"user","content":"hi"}]}`, nil)
	const cost = 1_002_500
	if r.CostMicro != cost || r.ChargedMicro != r.CapMicro || r.CapMicro >= cost {
		t.Fatalf("run %+v (answer %s): want cost %d, charged its cap", r, answer, cost)
	}
	series := h.metricSeries("tollgate_uncharged_micro_usd_total")
	if got := series[`source="complete"`]; got != cost-r.ChargedMicro {
		t.Errorf("tollgate_uncharged_micro_usd_total %v, want %d µUSD for source complete (cost %d, charged %d)",
			series, cost-r.ChargedMicro, cost, r.ChargedMicro)
	}
}
