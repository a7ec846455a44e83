package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestReconciledCallKeepsThePricesItWasBilledAt: a call answered by another model than the one
// asked for (a router's fallback, here one whose long-context rates are twice the asked
// model's) is billed at the answering model's price, and its row's snapshot records that
// price. When its process never settles it (the settlement gave up, the database out of reach;
// a kill -9 does the same) the reconciler settles it from its tally at the right cost, but the
// row kept the snapshot its hold recorded at admission, the asked model's: its tokens times
// its snapshot gave half its cost, and the bill could not be explained. The tally carries the
// prices the call was billed at when they are not those of its admission, whether written
// with the call's fingerprint or (duplicates not looked for) on its own.
func TestReconciledCallKeepsThePricesItWasBilledAt(t *testing.T) {
	t.Run("with the fingerprint", func(t *testing.T) { reconciledKeepsBilledPrices(t, false) })
	t.Run("without duplicates looked for", func(t *testing.T) { reconciledKeepsBilledPrices(t, true) })
}

func reconciledKeepsBilledPrices(t *testing.T, noDedup bool) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":300000,"completion_tokens":1000,"total_tokens":301000}}`,
			r.Header.Get("X-Answer"))
	}))
	t.Cleanup(up.Close)
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	priced := func(longIn, longOut int64) config.ModelCfg {
		return config.ModelCfg{Input: config.USDPerM{Micro: 100_000}, CacheRead: config.USDPerM{Micro: 100_000},
			CacheWrite: config.USDPerM{Micro: 100_000}, Output: config.USDPerM{Micro: 1_000_000},
			LongContext: config.LongContextCfg{AbovePromptTokens: 200_000, Input: config.USDPerM{Micro: longIn},
				CacheRead: config.USDPerM{Micro: longIn}, CacheWrite: config.USDPerM{Micro: longIn}, Output: config.USDPerM{Micro: longOut}}}
	}
	h := newHarnessOn(t, harnessSetup{db: db}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		c.Models["gemini-long"] = priced(200_000, 2_000_000)
		c.Models["gemini-dear"] = priced(400_000, 4_000_000)
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
		if noDedup {
			c.Dedup.Window = 0
		}
	})
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	u, key := h.user("standard")
	type billed struct {
		cost     int64
		snapshot string
	}
	want := map[string]billed{}
	for _, tc := range []struct {
		answer  string
		in, out int64 // the long-context rates it bills at
	}{{"gemini-long", 200_000, 2_000_000}, {"gemini-dear", 400_000, 4_000_000}} {
		resp := postSettlementLost(t, h, lossy, key, "/v1/chat/completions", `{"model":"gemini-long","models":["gemini-long","gemini-dear"],"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"X-Answer": tc.answer})
		p, name, err := table.Lookup(tc.answer)
		if err != nil {
			t.Fatal(err)
		}
		want[resp.Header.Get(proxy.RunIDHeader)] = billed{(300_000*tc.in + 1_000*tc.out + 999_999) / 1_000_000, string(p.Snapshot(name))}
	}
	if st := h.reconcileExpired(t, "user_id = ? AND state = 'running'", u.ID); st.FromTally != 2 {
		t.Fatalf("reconcile: %+v; want both runs settled from their tallies", st)
	}
	for id, w := range want {
		r := h.run(u.ID, id)
		var snapshot string
		if err := h.db.Get(&snapshot, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", id); err != nil {
			t.Fatal(err)
		}
		if r.SettleSource.String != holds.SourceReconcile || r.CostMicro != w.cost || snapshot != w.snapshot {
			t.Errorf("run %s settled by %q at cost %d with snapshot %s; want by the reconciler at %d with %s",
				id, r.SettleSource.String, r.CostMicro, snapshot, w.cost, w.snapshot)
		}
	}
}
