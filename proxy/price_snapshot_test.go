package proxy_test

import (
	"context"
	"maps"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunKeepsThePricesOfTheGatewayThatBilledIt: during a rollout of a new price table,
// a named run's calls are billed by a gateway on the old prices, and the run is settled on a
// gateway already on the new ones. The settled row's price snapshot must be the prices its
// calls were billed at (README: "a snapshot of the prices it was billed at"), recorded when
// the run was admitted, not the settling gateway's: otherwise its tokens times its snapshot
// do not give its cost and the bill cannot be explained.
func TestNamedRunKeepsThePricesOfTheGatewayThatBilledIt(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	_, repriced := h.secondGateway(nil, func(c *config.Config) {
		c.Models = maps.Clone(c.Models)
		m := c.Models["fake-gpt"]
		m.Input.Micro, m.Output.Micro = m.Input.Micro*2, m.Output.Micro*2
		c.Models["fake-gpt"] = m
	})
	run := map[string]string{"X-Run-Id": "task-repriced"}
	first, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "10"))
	runID := first.Header.Get(proxy.RunIDHeader)
	h.settled()
	var open struct {
		Snapshot *string `db:"price_snapshot"`
	}
	if err := h.db.GetContext(context.Background(), &open, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if status, body := settleAt(t, repriced, key, "task-repriced"); status != http.StatusOK {
		t.Fatalf("settle on the repriced gateway: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	prices, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	p, name, err := prices.Lookup("fake-gpt")
	if err != nil {
		t.Fatal(err)
	}
	var settled string
	if err := h.db.GetContext(context.Background(), &settled, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if want := string(p.Snapshot(name)); settled != want || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) || r.SettleSource.String != holds.SourceClient {
		t.Fatalf("settled run %+v with snapshot %s (open row's: %v); want the billing gateway's prices %s and their cost",
			r, settled, open.Snapshot, want)
	}
}
