package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestNamedRunOfAFreeModelKeepsItsCallsAcrossARedisRestart: README: a settlement takes
// whichever of the Redis tally and the run's row records more, so a Redis restart without
// persistence mid-run loses no call that had ended. A free model's calls all cost 0, so the
// tally a restart shrank (the calls since) and the row (every call) cost the same: the tie
// went to the tally, and the run settled without the tokens and calls of before the restart.
func TestNamedRunOfAFreeModelKeepsItsCallsAcrossARedisRestart(t *testing.T) {
	h := newHarness(t, freeFakeGPT)
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

// freeFakeGPT makes fake-gpt a free model: its calls all cost 0.
func freeFakeGPT(c *configT) {
	m := c.Models["fake-gpt"]
	m.Input, m.Output, m.CacheRead, m.CacheWrite = config.USDPerM{}, config.USDPerM{}, config.USDPerM{}, config.USDPerM{}
	c.Models["fake-gpt"] = m
}

// TestSettleOfAFreeModelsRunAfterARedisRestartWaitsForTheCallInFlight: a Redis restart
// without persistence takes a named run's tally and the reservation of its call in flight;
// another call of the run ends after it, so the settle finds a tally again, of one call where
// the run's row records two. A free model's calls cost 0, so that tally costs what the row
// does: the loss shows in its calls alone, and the settle must wait for the call in flight
// (409 run_busy) as it does for a paid model's run. Read as a loss only when the tally costs
// less, the run was closed past the call and settled without its tokens and its call.
func TestSettleOfAFreeModelsRunAfterARedisRestartWaitsForTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, freeFakeGPT)
	u, key := h.user("standard")
	const name = "free-inflight"
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, 40)
	held, letGo := h.heldStreamOK(t, gate, key, "held", slowStream(30, run))
	loseRunKeys(t, h, runID)
	// The third call, after the restart: its answer's end means it is tallied and recorded, the
	// run's tally again, of one call (h.settled would wait for the call in flight too).
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40")) // third call
	busyUntilItsCallEnds(t, h, key, name, runID, held, letGo, "of a free model's run with a call in flight after a Redis restart")
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 3 || r.OutTok != 110 || r.ChargedMicro != 0 {
		t.Fatalf("settled run %+v: want all three calls (110 output tokens), charged 0", r)
	}
}
