package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestCallIsBilledAtThePriceOfTheModelThatAnswered: a provider may answer a model asked for by
// another (an alias served by a dearer snapshot, a router's pick). When the model it names is
// priced under another configured name, the call is billed at that price, streamed or not; a
// model without a price, or none named, leaves the price asked for.
func TestCallIsBilledAtThePriceOfTheModelThatAnswered(t *testing.T) {
	answered := "dear-2025-01-01"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		usage := `{"prompt_tokens":1000,"completion_tokens":2000,"total_tokens":3000}`
		if r.Header.Get("X-Stream") == "" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":%s}`, r.Header.Get("X-Answer"), usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n", r.Header.Get("X-Answer"))
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", r.Header.Get("X-Answer"), usage)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
		cheap := c.Models["fake-gpt"]
		cheap.Input.Micro, cheap.Output.Micro = 100_000, 100_000 // $0.10 per million
		c.Models["cheap"] = cheap
		c.Models["dear"] = c.Models["fake-gpt"] // $2.50 / $10 per million
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	const cheapCost, dearCost = 300, 22_500 // 1000 in + 2000 out at each price, µUSD
	for _, tc := range []struct {
		name, answer string
		stream       bool
		want         int64
		pricedAs     string // the configured model whose prices the row's snapshot records
	}{
		{"dearer model answers", answered, false, dearCost, "dear"},
		{"dearer model answers a stream", answered, true, dearCost, "dear"},
		{"the model asked for answers", "cheap", false, cheapCost, "cheap"},
		{"an unpriced model answers", "mystery-1", false, cheapCost, "cheap"},
		{"no model named", "", false, cheapCost, "cheap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"X-Answer": tc.answer}
			body := `{"model":"cheap","messages":[{"role":"user","content":"hi"}]}`
			if tc.stream {
				hdr["X-Stream"] = "1"
				body = `{"model":"cheap","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			}
			resp, _ := h.postOK(t, key, "/v1/chat/completions", body, hdr)
			h.settled()
			runID := resp.Header.Get("X-Tollgate-Run-Id")
			if r := h.run(u.ID, runID); r.ChargedMicro != tc.want {
				t.Errorf("charged %d µUSD, want %d", r.ChargedMicro, tc.want)
			}
			// The row's snapshot is of the prices it was billed at: with another model's, its
			// tokens times its snapshot do not give its cost.
			var snapshot string
			if err := h.db.GetContext(context.Background(), &snapshot, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
				t.Fatal(err)
			}
			priced, _, err := table.Lookup(tc.pricedAs)
			if err != nil {
				t.Fatal(err)
			}
			if want := string(priced.Snapshot(tc.pricedAs)); snapshot != want {
				t.Errorf("price snapshot %s, want %s", snapshot, want)
			}
		})
	}
}
