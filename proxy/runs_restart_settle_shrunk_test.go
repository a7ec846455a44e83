package proxy_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestSettleRacingARedisRestartThenACallDoesNotMissTheCallInFlight: as
// TestSettleRacingARedisRestartDoesNotMissTheCallInFlight, a Redis restart without persistence
// lands between a named run's settle reading the run's tally and its close, a call of the run
// in flight — but another call of the run ends in between, so the close finds a tally again,
// one with fewer calls than the settle first read. A tally only grows: this one shrank, so the
// close did not see the call in flight (its reservation went with the restart), and settled
// now, from the row's record of the ended calls, the run was charged without it, and the call
// ended on a settled run, charged nothing. The settle is answered run_busy, and every call counts.
func TestSettleRacingARedisRestartThenACallDoesNotMissTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-race-shrunk"}
	runID := firstRunCall(t, h, key, run, 40)
	firstRunCall(t, h, key, run, 40) // the tally the settle reads first counts two calls
	hdr, letGo := heldMidStream(t, gate, "held", slowStream(40, run))
	held := h.post(key, "/v1/chat/completions", streamBody, hdr)
	defer held.Body.Close()
	if held.StatusCode != http.StatusOK {
		t.Fatalf("held call: %d", held.StatusCode)
	}
	br := firstEvent(t, held)
	var lost sync.Once
	var lostAt atomic.Bool
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step != "run close" {
			return
		}
		lost.Do(func() {
			loseRunKeys(t, h, runID)
			// A call of the run that ends after the restart, before the close: the tally is
			// there again, with its one call.
			after := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
			readAll(t, after.Body)
			after.Body.Close()
			if after.StatusCode != http.StatusOK {
				t.Errorf("call after the restart: %d", after.StatusCode)
			}
			lostAt.Store(true)
		})
	})
	status, body := h.settleRun(key, "task-race-shrunk")
	if !lostAt.Load() {
		t.Fatal("the settle never came to close the run: the restart was not made where the test means it")
	}
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Errorf("settle as Redis lost the run's keys, a call of it in flight and one ended since: %d %s; want 409 run_busy", status, body)
	}
	letGo()
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if status, body := settleAfterRebuild(h, key, "task-race-shrunk", runID); status != http.StatusOK {
		t.Fatalf("settle once the call ended: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 4 || r.OutTok != 160 {
		t.Fatalf("run settled as %s with %d calls, %d output tokens; want all four calls (160 output tokens) charged", r.State, r.Calls, r.OutTok)
	}
}
