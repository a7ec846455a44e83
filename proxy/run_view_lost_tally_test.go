package proxy_test

import (
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
