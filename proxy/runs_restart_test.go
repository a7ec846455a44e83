package proxy_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
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
