package proxy_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestSettleRacingARedisRestartDoesNotMissTheCallInFlight: a Redis restart without persistence
// lands between a named run's settle reading the run's record (nothing lost yet) and its close
// of the run. The close found no reservation — the restart took that of the call in flight —
// and the run settled without it; the call then ended on a settled run, charged nothing,
// though its agent saw it whole. The settle now reads, once the run is closed, whether Redis
// lost calls the run's row records since it looked: then the run is reopened and the settle
// answered run_busy, as one that finds the loss first is, and the call counts.
func TestSettleRacingARedisRestartDoesNotMissTheCallInFlight(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-race"}
	runID := firstRunCall(t, h, key, run, 40)
	hdr, letGo := heldMidStream(t, gate, "second", slowStream(40, run))
	second := h.post(key, "/v1/chat/completions", streamBody, hdr)
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("second call: %d", second.StatusCode)
	}
	br := firstEvent(t, second)
	var lost sync.Once
	var lostAt atomic.Bool
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "run close" {
			lost.Do(func() { loseRunKeys(t, h, runID); lostAt.Store(true) })
		}
	})
	status, body := h.settleRun(key, "task-race")
	if !lostAt.Load() {
		t.Fatal("the settle never came to close the run: the restart was not made where the test means it")
	}
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Errorf("settle as Redis lost the run's keys, a call of it in flight: %d %s; want 409 run_busy", status, body)
	}
	letGo()
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if status, body := settleAfterRebuild(h, key, "task-race", runID); status != http.StatusOK {
		t.Fatalf("settle once the call ended: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 2 || r.OutTok != 80 {
		t.Fatalf("run settled as %s with %d calls, %d output tokens; want both calls (80 output tokens) charged", r.State, r.Calls, r.OutTok)
	}
}
