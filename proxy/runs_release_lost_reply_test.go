package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestRunCallWhoseReleaseReplyWasLostDropsItsRecordMark: on a run whose Redis record lost
// calls (a restart without persistence), a call's tally (RunBudget.ReleaseBeforeRecord) marks
// the call as recorded-to-come, and the call drops the mark once its record is on the run's
// row. When the tally ran and its reply was lost, go-redis sent the script again, and the
// resend, finding the call tallied, answered "no mark": the call never dropped it, and a settle
// of the run sent after its answer was refused 409 run_busy until the mark lapsed (the lease
// TTL), with nothing in flight.
func TestRunCallWhoseReleaseReplyWasLostDropsItsRecordMark(t *testing.T) {
	// The release script alone names a run's lost mark among a call's writes (the reservation
	// names the call's done mark too).
	lose := disarmedReplyLoser("billing:lost:{")
	h := newHarnessOn(t, harnessSetup{redisDialer: lose.dial}, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-release-lost"}
	// The first call also loads the release script into Redis: the second's goes as EVALSHA
	// and runs, rather than coming back NOSCRIPT.
	runID := firstRunCall(t, h, key, run, 5)
	loseRunKeys(t, h, runID)
	// The restart was noticed lease_ttl ago: a settle no longer waits for the rebuild.
	if err := h.rdb.Set(context.Background(), h.keys.Lost(runID), 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	lose.arm()
	second := h.post(key, "/v1/chat/completions", chatBody, run)
	readAll(t, second.Body)
	second.Body.Close()
	lose.ranAndLost(t)
	if second.StatusCode != http.StatusOK {
		t.Fatalf("call whose tally reply was lost: %d", second.StatusCode)
	}
	h.settled()

	if status, body := h.settleRun(key, "task-release-lost"); status != http.StatusOK {
		t.Fatalf("settle after the run's calls ended: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != "settled" || r.Calls != 2 {
		t.Fatalf("run %+v: want settled with both calls", r)
	}
}
