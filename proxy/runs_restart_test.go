package proxy_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// callsAcrossARedisRestart makes a 40-token call of the named run name, loses every Redis key
// of the run (a restart without persistence, as the compose file runs Redis), then makes a
// 5-token call of it. It returns the run's id.
func callsAcrossARedisRestart(t *testing.T, h *harness, key, name string) string {
	t.Helper()
	return callsAcrossARedisRestartWith(t, h, key, name, 40, chatBody, 5)
}

// callsAcrossARedisRestartWith is callsAcrossARedisRestart with a first call of firstChunks
// output tokens and a second one of body answering with secondChunks.
func callsAcrossARedisRestartWith(t *testing.T, h *harness, key, name string, firstChunks int, body string, secondChunks int) string {
	t.Helper()
	run := map[string]string{"X-Run-Id": name}
	runID := firstRunCall(t, h, key, run, firstChunks)
	loseRunKeys(t, h, runID)
	h.postOK(t, key, "/v1/chat/completions", body, with(run, fakellm.HeaderChunks, strconv.Itoa(secondChunks))) // second call
	h.settled()
	return runID
}

// TestNamedRunSurvivesARedisRestart: a Redis restart in the middle of a named run loses the
// run's tally and reservations; the calls made before it are still charged when the run
// settles (its row records each ended call).
func TestNamedRunSurvivesARedisRestart(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := callsAcrossARedisRestart(t, h, key, "task-restart")
	if status, body := settleAfterRebuild(h, key, "task-restart", runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("settled run %+v: charged %d for %d output tokens over %d calls; want both calls (45 output tokens) charged",
			r, r.ChargedMicro, r.OutTok, r.Calls)
	}
}

// TestLiveRunViewAfterRedisRestartShowsWhatItWillBeCharged: after a Redis restart a live named
// run's tally has lost its earlier calls, which its row still records and its settlement
// charges (the larger of the two). GET /v1/runs/{id} must not show the smaller.
func TestLiveRunViewAfterRedisRestartShowsWhatItWillBeCharged(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := callsAcrossARedisRestart(t, h, key, "task-view")
	status, view := h.get(key, "/v1/runs/task-view")
	if status != http.StatusOK {
		t.Fatalf("get: %d %v", status, view)
	}
	usage, _ := view["usage"].(map[string]any)
	r := h.run(u.ID, runID)
	if got, _ := usage["output"].(float64); int64(got) != r.OutTok || r.OutTok != 45 {
		t.Errorf("live run shows %v output tokens, %v; its row records %d over %d calls, which is what settling charges",
			got, view, r.OutTok, r.Calls)
	}
}

// TestSettleWhoseRebuildWaitFailsIsRefused: a settle of a named run whose Redis record lost
// calls (a restart) first waits for the run's calls in flight to be seen again
// (RunBudget.AwaitRebuild). When that wait fails in Redis (every attempt of its script cut), the
// settle cannot know whether a call is in flight whose reservation went with the restart: it
// must refuse, 503 with nothing charged and the run left open, not go on to close the run past
// a call it cannot see (that call would then end on a settled run, charged nothing). A later
// settle charges every call, the ones made after the refusal included.
func TestSettleWhoseRebuildWaitFailsIsRefused(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	runID := callsAcrossARedisRestart(t, h, key, "task-rebuild-wait-fails")
	// The wait's script alone names the run's lost mark among the settle's writes.
	attempts := h.rdb.Options().MaxRetries + 1
	lossy.Arm(h.keys.Lost(runID), testenv.RedisRequestLost, attempts)
	status, body := h.settleRun(key, "task-rebuild-wait-fails")
	if lossy.Fired() != attempts {
		t.Fatalf("%d attempts of the rebuild wait lost, want every one, %d", lossy.Fired(), attempts)
	}
	if status != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" {
		t.Fatalf("settle whose rebuild wait failed in Redis: %d %s, want 503 billing_unavailable", status, body)
	}
	if r := h.run(u.ID, runID); r.State == holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("run %+v after a refused settle: want it open, nothing charged", r)
	}
	// The run is still open: its calls are admitted.
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(map[string]string{"X-Run-Id": "task-rebuild-wait-fails"},
		fakellm.HeaderChunks, "5")) // third call, after the refused settle
	h.settled()
	if status, body := settleAfterRebuild(h, key, "task-rebuild-wait-fails", runID); status != http.StatusOK {
		t.Fatalf("settle once Redis answers: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 3 || r.OutTok != 50 {
		t.Fatalf("settled run %+v: want all three calls (50 output tokens) charged", r)
	}
}

// TestSettleWhoseRowReadAfterTheCloseFailsIsRefused: once a settle has closed its run in Redis
// it reads the run's row (what its calls recorded) to charge the larger record. When that read
// fails, the settle must refuse (503, nothing charged, the run reopened), not charge the
// tally alone: after a Redis restart the tally lost calls the row records, and they went
// uncharged.
func TestSettleWhoseRowReadAfterTheCloseFailsIsRefused(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, dsn)}, nil)
	u, key := h.user("standard")
	runID := callsAcrossARedisRestart(t, h, key, "task-row-read-fails")
	var armed atomic.Bool
	armed.Store(true)
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "run close" && armed.CompareAndSwap(true, false) {
			lossyDB.Arm("NOW(6) AS read_at FROM run_holds WHERE run_id = ", testenv.LoseReply)
		}
	})
	status, body := settleAfterRebuild(h, key, "task-row-read-fails", runID)
	if !lossyDB.Fired() {
		t.Fatal("the run's row read after the close never reached the database")
	}
	if status != http.StatusServiceUnavailable {
		t.Fatalf("settle whose row read failed: %d %s, want 503", status, body)
	}
	if r := h.run(u.ID, runID); r.State == holds.StateSettled {
		t.Fatalf("run %+v settled although its settle answered 503", r)
	}
	if status, body := h.settleRun(key, "task-row-read-fails"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 45 {
		t.Fatalf("settled run %+v: want both calls (45 output tokens) charged", r)
	}
}

// firstRunCall makes a call of the named run in hdr that answers with chunks output tokens,
// waits for its settlement path, and returns the run's id.
func firstRunCall(t *testing.T, h *harness, key string, hdr map[string]string, chunks int) string {
	t.Helper()
	first, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, with(hdr, fakellm.HeaderChunks, strconv.Itoa(chunks))) // first call
	h.settled()
	return first.Header.Get(proxy.RunIDHeader)
}

// loseRunKeys does to a run what a Redis restart without persistence does: every key of it is
// gone (tally, budget and reservations, lease).
func loseRunKeys(t *testing.T, h *harness, runID string) {
	t.Helper()
	if err := h.rdb.Del(context.Background(), h.keys.Usage(runID), h.keys.RunBudget(runID), h.keys.Lease(runID)).Err(); err != nil {
		t.Fatal(err)
	}
}
