package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestSettleAfterARedisRestartOfARunWhoseCallsUsedNothingThenAnotherEndedWaitsForTheCallInFlight:
// a named run whose only ended call failed (its row records it at 0: one ended call, none
// counted, no cost) loses its Redis keys to a restart while its next call streams, and a third
// call, made after the restart, ends before the settle. The tally (the third call alone) and
// the row (the failed call at 0 and the third) then agree on cost and counted calls, and the
// third call's reservation found no shortfall (the row's record before it cost 0), so nothing
// marks the loss: the settle closed the run past the call in flight — whose reservation the
// restart took, and whose lease comes back only at its process's next heartbeat — and settled
// it without that call, which then ended on a settled run, charged nothing. The row's ended
// calls say Redis lost a call: the failed one, whose zero tally went with the restart.
func TestSettleAfterARedisRestartOfARunWhoseCallsUsedNothingThenAnotherEndedWaitsForTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	const name = "task-lost-unused-then-one"
	run := map[string]string{"X-Run-Id": name}
	runID := failedRunCall(t, h, u.ID, key, run)
	held, letGo := h.heldStreamOK(t, gate, key, "held", slowStream(40, run))
	br := firstEvent(t, held)
	loseRunKeys(t, h, runID)
	// Ends after the restart, before the settle: its tally and its record on the row land before
	// its answer ends.
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
	status, body := h.settleRun(key, name)
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Errorf("settle after Redis lost the run's keys, a call of it in flight: %d %s; want 409 run_busy", status, body)
	}
	letGo()
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if status == http.StatusConflict {
		if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
			t.Fatalf("settle once the call ended: %d %s", status, body)
		}
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 80 || r.ChargedMicro != r.CostMicro {
		t.Fatalf("run %+v: want settled with both calls that used something charged (80 output tokens)", r)
	}
}
