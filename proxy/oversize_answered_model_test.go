package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestOversizedAnswerCutAtItsBoundIsPricedAsTheModelThatAnswered: an answer too large to relay
// and longer than what is read past it (four times max_response_bytes), cut there without a
// report, is charged the output read; a router's pick that answered with a dearer priced model
// than the one asked for is billed at that model's prices, as the same answer read to its end
// or broken midway is (the model its head names), clamped to the call's cap.
func TestOversizedAnswerCutAtItsBoundIsPricedAsTheModelThatAnswered(t *testing.T) {
	const limit = 64 << 10
	words := strings.Repeat("words ", limit)
	body := `{"id":"chatcmpl-1","object":"chat.completion","model":"dear-2025-01-01","choices":[{"index":0,"message":` +
		`{"role":"assistant","content":"` + words + `"},"finish_reason":"stop"}]}`
	up := &fixedUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		cheap := c.Models["fake-gpt"]
		cheap.Input.Micro, cheap.Output.Micro = 100_000, 100_000 // $0.10 per million
		c.Models["cheap"] = cheap
		c.Models["dear"] = c.Models["fake-gpt"] // $2.50 / $10 per million
		c.Limits.MaxResponseBytes = limit
	})
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	dear, _, err := table.Lookup("dear")
	if err != nil {
		t.Fatal(err)
	}
	for _, length := range []bool{false, true} {
		u, key := h.user("standard")
		up.set(body, length)
		resp := h.post(key, "/v1/chat/completions", `{"model":"cheap","messages":[{"role":"user","content":"Say hello."}]}`, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, answer) != "upstream_response_too_large" {
			t.Fatalf("Content-Length %v: %d %s, want 502 upstream_response_too_large", length, resp.StatusCode, answer)
		}
		runID := resp.Header.Get(proxy.RunIDHeader)
		got := h.run(u.ID, runID)
		if !got.Estimated || got.SettleSource.String != holds.SourceStreamError || got.OutTok <= 0 {
			t.Fatalf("Content-Length %v: run %+v, want the output read estimated, settled stream_error", length, got)
		}
		// The cap is reckoned at the price asked for; the output read at the dearer one passes it.
		if want := fakeGPTCost(got.InTok, got.OutTok); got.CostMicro != want || want <= got.CapMicro || got.ChargedMicro != got.CapMicro {
			t.Errorf("Content-Length %v: %d in, %d out cost %d µUSD, charged %d (cap %d); want %d at the answering model's prices, past the cap, charged the cap",
				length, got.InTok, got.OutTok, got.CostMicro, got.ChargedMicro, got.CapMicro, want)
		}
		var snapshot string
		if err := h.db.GetContext(context.Background(), &snapshot, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
			t.Fatal(err)
		}
		if want := string(dear.Snapshot("dear")); snapshot != want {
			t.Errorf("Content-Length %v: price snapshot %s, want the answering model's, %s", length, snapshot, want)
		}
	}
}
