package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestRunViewShowsWhatTheRunHoldsTalliedAndCharged: DESIGN §4, "GET /v1/runs/{id} shows
// state, held, tallied usage and charge". An agent reads it to decide whether to go on: a live
// run must show the hold and cap it was admitted with and what its calls have tallied, and a
// settled one what it was charged (after its discount) beside its cost at list price. The
// figures are compared with the run's row and its Redis tally, to the last micro-USD, at a
// discount, so that a view showing the cost as the charge, or the cap as the hold, is caught.
func TestRunViewShowsWhatTheRunHoldsTalliedAndCharged(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	discount := 2_500 // 25 %: the charge differs from the cost
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, nil, &discount); err != nil {
		t.Fatal(err)
	}
	credits := func(micro int64) json.Number { return json.Number(pricing.FormatCredits(micro, h.cfg.CreditMicro)) }
	run := map[string]string{"X-Run-Id": "view-figures"}
	var runID string
	for i, chunks := range []int{7, 11} {
		resp := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, strconv.Itoa(chunks)))
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d", i, resp.StatusCode)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
		h.settled()
	}

	// Live: its hold and cap as admitted, what its two calls tallied.
	row := h.run(u.ID, runID)
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 2 || tl.CostMicro == 0 {
		t.Fatalf("tally of the live run: %+v, %v, %v; want two calls that cost something", tl, found, err)
	}
	if row.HeldMicro == row.CapMicro {
		t.Fatalf("run %+v holds its cap: the test cannot tell the two apart", row)
	}
	status, view := h.getExact(key, "/v1/runs/view-figures")
	if status != http.StatusOK {
		t.Fatalf("GET the live run: %d %v", status, view)
	}
	usage, _ := view["usage"].(map[string]any)
	if view["state"] != string(holds.StateRunning) || view["id"] != runID || view["name"] != "view-figures" ||
		view["held"] != credits(row.HeldMicro) || view["cap"] != credits(row.CapMicro) ||
		view["tallied_cost"] != credits(tl.CostMicro) ||
		usage["output"] != json.Number(strconv.FormatInt(tl.Usage.Output, 10)) ||
		usage["input"] != json.Number(strconv.FormatInt(tl.Usage.Input, 10)) ||
		usage["calls"] != json.Number("2") {
		t.Errorf("live run shows %v; want state running, held %s, cap %s, tallied_cost %s, usage %+v over 2 calls",
			view, credits(row.HeldMicro), credits(row.CapMicro), credits(tl.CostMicro), tl.Usage)
	}
	if _, ok := view["charged"]; ok {
		t.Errorf("live run shows a charge: %v", view)
	}

	// Settled: what it was charged, at its discount, beside its cost.
	if status, body := h.settleRun(key, "view-figures"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	row = h.run(u.ID, runID)
	if row.State != holds.StateSettled || row.CostMicro != tl.CostMicro ||
		row.ChargedMicro != pricing.ApplyDiscount(row.CostMicro, discount) || row.ChargedMicro == row.CostMicro {
		t.Fatalf("settled row %+v: want cost %d charged at a 25%% discount", row, tl.CostMicro)
	}
	status, view = h.getExact(key, "/v1/runs/"+runID)
	if status != http.StatusOK {
		t.Fatalf("GET the settled run: %d %v", status, view)
	}
	usage, _ = view["usage"].(map[string]any)
	if view["state"] != string(holds.StateSettled) || view["charged"] != credits(row.ChargedMicro) ||
		view["cost"] != credits(row.CostMicro) || view["held"] != credits(row.HeldMicro) ||
		view["settle_source"] != holds.SourceClient || view["estimated"] != false ||
		usage["output"] != json.Number(strconv.FormatInt(row.OutTok, 10)) || usage["calls"] != json.Number("2") {
		t.Errorf("settled run shows %v; want state settled, charged %s, cost %s, held %s, settle_source %s, not estimated, %d output tokens over 2 calls",
			view, credits(row.ChargedMicro), credits(row.CostMicro), credits(row.HeldMicro), holds.SourceClient, row.OutTok)
	}
	if _, ok := view["tallied_cost"]; ok {
		t.Errorf("settled run still shows a tally: %v", view)
	}
}
