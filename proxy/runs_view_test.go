package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestLiveRunViewAfterRedisRestartShowsWhatItWillBeCharged: after a Redis restart a live named
// run's tally has lost its earlier calls, which its row still records and its settlement
// charges (the larger of the two). GET /v1/runs/{id} must not show the smaller.
func TestLiveRunViewAfterRedisRestartShowsWhatItWillBeCharged(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-view"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "40"))
	readAll(t, first.Body)
	first.Body.Close()
	runID := first.Header.Get(proxy.RunIDHeader)
	h.settled()
	ctx := context.Background()
	if err := h.rdb.Del(ctx, h.keys.Usage(runID), h.keys.RunBudget(runID), h.keys.Lease(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	second := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "5"))
	readAll(t, second.Body)
	second.Body.Close()
	h.settled()
	status, view := h.get(key, "/v1/runs/task-view")
	if status != http.StatusOK {
		t.Fatalf("get: %d %v", status, view)
	}
	usage, _ := view["usage"].(map[string]any)
	r := h.run(u.ID, runID)
	if got := int64(usage["output"].(float64)); got != r.OutTok {
		t.Errorf("live run shows %v output tokens, %v; its row records %d over %d calls, which is what settling charges",
			got, view, r.OutTok, r.Calls)
	}
}
