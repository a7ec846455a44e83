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
	"github.com/tollgate/tollgate/proxy"
)

// TestSettleRacingARedisRestartDoesNotMissTheCallInFlight: a Redis restart without persistence
// lands between a named run's settle reading the run's record (nothing lost yet) and its close
// of the run. The close found no reservation — the restart took that of the call in flight —
// and the run settled without it; the call then ended on a settled run, charged nothing,
// though its agent saw it whole. The settle now reads, once the run is closed, whether Redis
// lost calls the run's row records since it looked: then the run is reopened and the settle
// answered run_busy, as one that finds the loss first is, and the call counts. Reopened, the
// run takes its next call at once.
//
// So too when another call of the run ends between the restart and the close: the close
// finds a tally again, one with fewer calls than the settle first read. A tally only grows:
// taken as it stood, it hid the call in flight as a missing one did. And when the run's ended
// calls used nothing: the settle first read a tally of no calls, and the close finds none at
// all, which is no fewer calls; taken as a run without a tally, it was settled at its row's
// record of 0, past the call in flight.
func TestSettleRacingARedisRestartDoesNotMissTheCallInFlight(t *testing.T) {
	for _, tc := range []struct {
		name, run string
		before    int  // calls of the run ended before the settle
		between   bool // a call of the run ends between the restart and the close
		failed    bool // the run's one ended call failed, used nothing (before 0)
	}{
		{"no tally at the close", "task-race", 1, false, false},
		{"a smaller tally at the close", "task-race-shrunk", 2, true, false},
		{"no tally at the close of a run whose calls used nothing", "task-race-unused", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, gate := gatedHarness(t, nil)
			u, key := h.user("standard")
			run := map[string]string{"X-Run-Id": tc.run}
			var runID string
			if tc.failed {
				runID = failedRunCall(t, h, u.ID, key, run)
			} else {
				runID = firstRunCall(t, h, key, run, 40)
			}
			for range tc.before - 1 {
				firstRunCall(t, h, key, run, 40)
			}
			held, letGo := h.heldStreamOK(t, gate, key, "held", slowStream(40, run))
			br := firstEvent(t, held)
			var lost sync.Once
			var lostAt atomic.Bool
			h.srv.ObserveSteps(func(_ context.Context, step string) {
				if step != "run close" {
					return
				}
				lost.Do(func() {
					loseRunKeys(t, h, runID)
					if tc.between {
						after := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
						readAll(t, after.Body)
						after.Body.Close()
						if after.StatusCode != http.StatusOK {
							t.Errorf("call after the restart: %d", after.StatusCode)
						}
					}
					lostAt.Store(true)
				})
			})
			status, body := h.settleRun(key, tc.run)
			if !lostAt.Load() {
				t.Fatal("the settle never came to close the run: the restart was not made where the test means it")
			}
			if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
				t.Errorf("settle as Redis lost the run's keys, a call of it in flight: %d %s; want 409 run_busy", status, body)
			}
			// Reopened: the run's next call is served, not refused 409 run_settled until the
			// close's mark lapses.
			next := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
			if b := readAll(t, next.Body); next.StatusCode != http.StatusOK {
				t.Errorf("the run's next call after its settle found the loss: %d %s; want 200 (the run reopened)", next.StatusCode, b)
			}
			next.Body.Close()
			letGo()
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Fatal(err)
			}
			h.settled()
			if status, body := settleAfterRebuild(h, key, tc.run, runID); status != http.StatusOK {
				t.Fatalf("settle once the call ended: %d %s", status, body)
			}
			calls := tc.before + 2 // the held call and the one after the busy settle
			if tc.between {
				calls++
			}
			if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != calls || r.OutTok != int64(40*calls) {
				t.Fatalf("run settled as %s with %d calls, %d output tokens; want all %d calls (%d output tokens) charged",
					r.State, r.Calls, r.OutTok, calls, 40*calls)
			}
		})
	}
}

// TestSettleAfterARedisRestartOfARunWhoseCallsUsedNothingWaitsForTheCallInFlight: a named run
// whose only ended call failed (its row records it at 0: found, no calls, no cost) loses its
// Redis keys to a restart while its next call streams, the run older than the longest call.
// The settle finds no tally, and a row that records the run's ended calls: Redis lost them,
// whatever they cost, and the call in flight's reservation with them, so the settle is
// run_busy until that call's lease is seen again. Read as a loss only of calls that cost
// something or counted, the run was closed past the call, settled at 0, and the call ended
// on a settled run, charged nothing.
func TestSettleAfterARedisRestartOfARunWhoseCallsUsedNothingWaitsForTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	const name = "task-lost-unused"
	run := map[string]string{"X-Run-Id": name}
	runID := failedRunCall(t, h, u.ID, key, run)
	// Older than the longest call: a run without a tally is not taken for one whose first call
	// is still between its admission and its reservation.
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	held, letGo := h.heldStreamOK(t, gate, key, "held", slowStream(40, run))
	br := firstEvent(t, held)
	loseRunKeys(t, h, runID)
	if status, body := h.settleRun(key, name); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle after Redis lost the run's keys, a call of it in flight: %d %s; want 409 run_busy", status, body)
	}
	letGo()
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
		t.Fatalf("settle once the call ended: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 1 || r.OutTok != 40 || r.ChargedMicro != fakeGPTCost(r.InTok, 40) {
		t.Fatalf("run %+v: want settled with the call that was in flight charged (40 output tokens)", r)
	}
}

// failedRunCall makes a named run's first call, failed upstream (503): the run's row records
// it at 0, one ended call and none counted. It returns the run's id.
func failedRunCall(t *testing.T, h *harness, userID uint64, key string, run map[string]string) string {
	t.Helper()
	failed := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderStatus, "503"))
	readAll(t, failed.Body)
	failed.Body.Close()
	if failed.StatusCode != http.StatusBadGateway {
		t.Fatalf("first call, upstream 503: %d, want 502", failed.StatusCode)
	}
	h.settled()
	runID := failed.Header.Get(proxy.RunIDHeader)
	if r := h.run(userID, runID); r.EndedCalls != 1 || r.Calls != 0 || r.CostMicro != 0 {
		t.Fatalf("run %+v after its failed call: want it recorded at 0 (1 ended call, none counted)", r)
	}
	return runID
}
