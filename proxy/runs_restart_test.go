package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunSurvivesARedisRestart: Redis restarted (no persistence, as the compose file
// runs it) in the middle of a named run loses the run's tally and reservations. The calls made
// before must still be charged, and the run's cap must still bound what its calls use.
func TestNamedRunSurvivesARedisRestart(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-restart"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
	readAll(t, first.Body)
	first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d", first.StatusCode)
	}
	runID := first.Header.Get(proxy.RunIDHeader)
	h.settled()
	// Redis restarts: every key of the run is gone.
	ctx := context.Background()
	if err := h.rdb.Del(ctx, h.keys.Usage(runID), h.keys.RunBudget(runID), h.keys.Lease(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	second := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5"))
	readAll(t, second.Body)
	second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("second call: %d", second.StatusCode)
	}
	if status, body := h.settleRun(key, "task-restart"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("settled run %+v: charged %d for %d output tokens over %d calls; want both calls (45 output tokens) charged",
			r, r.ChargedMicro, r.OutTok, r.Calls)
	}
}
