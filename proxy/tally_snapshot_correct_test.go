package proxy_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestReconciledCallWhoseUsageCameAfterTheFinalEventKeepsItsPrices: a plain stream is tallied
// at its final event, with the prices it is billed at when they are not its hold's. One whose
// prompt is marked for the cache (cache_control, here sent to a chat route through a router
// serving Claude) and which has no usage report by then is tallied as an estimate, its prompt
// at the cache-write price, and the tally carries that price. A report after the final event
// replaces the estimate: the settlement corrects the tally's figures, at the model's own
// prices, but the tally kept the cache-write price. When that settlement did not commit (the
// database out of reach; a kill -9 does the same) the reconciler settled the run at the
// corrected cost with the cache-write prices: its tokens times its snapshot did not give its
// cost. The correction carries the prices too.
func TestReconciledCallWhoseUsageCameAfterTheFinalEventKeepsItsPrices(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = upstreamSending(t,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
			`[DONE]`,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`)
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
	})
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	p, name, err := table.Lookup("fake-gpt")
	if err != nil {
		t.Fatal(err)
	}
	u, key := h.user("standard")
	resp := postSettlementLost(t, h, lossy, key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`, nil)
	runID := resp.Header.Get(proxy.RunIDHeader)
	if st := h.reconcileExpired(t, "run_id = ?", runID); st.FromTally != 1 {
		t.Fatalf("reconcile: %+v; want the run settled from its tally", st)
	}
	r := h.run(u.ID, runID)
	var snapshot string
	if err := h.db.Get(&snapshot, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if r.OutTok != 50 || r.CostMicro != fakeGPTCost(10, 50) || snapshot != string(p.Snapshot(name)) {
		t.Errorf("settled %d output tokens at %d µUSD with snapshot %s; want the report's 50 at %d with the model's own prices %s",
			r.OutTok, r.CostMicro, snapshot, fakeGPTCost(10, 50), p.Snapshot(name))
	}
}
