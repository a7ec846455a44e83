package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestNamedRunOfAFreeModelKeepsItsCallsAcrossARedisRestart: README: a settlement takes
// whichever of the Redis tally and the run's row records more, so a Redis restart without
// persistence mid-run loses no call that had ended. A free model's calls all cost 0, so the
// tally a restart shrank (the calls since) and the row (every call) cost the same: the tie
// went to the tally, and the run settled without the tokens and calls of before the restart.
func TestNamedRunOfAFreeModelKeepsItsCallsAcrossARedisRestart(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.Input, m.Output, m.CacheRead, m.CacheWrite = config.USDPerM{}, config.USDPerM{}, config.USDPerM{}, config.USDPerM{}
		c.Models["fake-gpt"] = m
	})
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "free-restart"}
	runID := firstRunCall(t, h, key, run, 40)
	loseRunKeys(t, h, runID)
	firstRunCall(t, h, key, run, 40)
	if r := h.run(u.ID, runID); r.OutTok != 80 || r.Calls != 2 {
		t.Fatalf("run's row %+v: want both calls recorded, 80 output tokens", r)
	}
	status, view := h.get(key, "/v1/runs/free-restart")
	usage, _ := view["usage"].(map[string]any)
	if got, _ := usage["output"].(float64); status != http.StatusOK || got != 80 || usage["calls"] != float64(2) {
		t.Errorf("GET the open run: %d %v; want both calls' 80 output tokens, as settling charges", status, view)
	}
	if status, body := settleAfterRebuild(h, key, "free-restart", runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro != 0 || r.OutTok != 80 || r.Calls != 2 {
		t.Fatalf("settled run %+v: want both calls, 80 output tokens, charged 0", r)
	}
}
