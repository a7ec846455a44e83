package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestLiveRunViewWithoutATallyShowsItsRowsRecord: GET /v1/runs/{id} of an open run whose Redis
// tally is gone entirely (a restart without persistence, no call since) shows as tallied_cost
// what the run's row recorded of its ended calls — what a settle would charge it (README: the
// settlement takes whichever of the tally and the row cost more). Without it the run read as
// one that had used nothing.
func TestLiveRunViewWithoutATallyShowsItsRowsRecord(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	credits := func(micro int64) json.Number { return json.Number(pricing.FormatCredits(micro, h.cfg.CreditMicro)) }
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "view-no-tally"}, 40)
	loseRunKeys(t, h, runID)
	row := h.run(u.ID, runID)
	if row.CostMicro == 0 || row.OutTok != 40 {
		t.Fatalf("run's row %+v: want the call's 40 output tokens and its cost recorded", row)
	}
	status, view := h.getExact(key, "/v1/runs/view-no-tally")
	usage, _ := view["usage"].(map[string]any)
	if status != http.StatusOK || view["state"] != string(holds.StateRunning) || view["tallied_cost"] != credits(row.CostMicro) ||
		usage["output"] != json.Number(strconv.FormatInt(row.OutTok, 10)) {
		t.Fatalf("GET the open run without a tally: %d %v; want running, tallied_cost %s, %d output tokens (its row's record)",
			status, view, credits(row.CostMicro), row.OutTok)
	}
}

// TestLiveRunViewShowsItsTallyWhenItsRowRecordsLess: the row's record of a run's ended calls
// can lag its Redis tally (a call's record not yet written, or written after a database
// outage); the live view then shows the tally's usage, as its tallied_cost — not the row's,
// which would read as calls that used nothing.
func TestLiveRunViewShowsItsTallyWhenItsRowRecordsLess(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	credits := func(micro int64) json.Number { return json.Number(pricing.FormatCredits(micro, h.cfg.CreditMicro)) }
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "view-row-behind"}, 40)
	// The row has no record of the call; its tally has it.
	if _, err := h.db.Exec(`UPDATE run_holds SET cost_micro = 0, in_tok = 0, cache_read_tok = 0, cache_write_tok = 0,
		out_tok = 0, ended_calls = 0 WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Usage.Output != 40 || tl.CostMicro == 0 {
		t.Fatalf("tally of the run: %+v, %v, %v; want the call's 40 output tokens and its cost", tl, found, err)
	}
	status, view := h.getExact(key, "/v1/runs/view-row-behind")
	usage, _ := view["usage"].(map[string]any)
	if status != http.StatusOK || view["state"] != string(holds.StateRunning) || view["tallied_cost"] != credits(tl.CostMicro) ||
		usage["output"] != json.Number("40") {
		t.Fatalf("GET the open run whose row records less than its tally: %d %v; want running, tallied_cost %s, 40 output tokens (its tally's)",
			status, view, credits(tl.CostMicro))
	}
}
