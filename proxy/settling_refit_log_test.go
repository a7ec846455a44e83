package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestLostAdmissionAgainAfterASmallHoldNamesItsOwnRun: a long prompt whose first hold was too
// small while its user's answered call settled is released at 0 and admitted again under a new
// run (admitFitting). When that second admission's COMMIT goes unanswered, the caller is refused
// 503 and the hold it may have left is released in the background: the lines that say so (the
// refusal, "admission outcome unknown", and the release's) must name the run of that hold, the
// one an operator finds in run_holds, not the first, already released, run. They named the
// first: the logger was made once for the request's first run id.
func TestLostAdmissionAgainAfterASmallHoldNamesItsOwnRun(t *testing.T) {
	h, lossy, logs := newObservedLossyHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	var admits atomic.Int32
	answered := firstCallSettling(t, h, key, func(_ context.Context, step string) {
		if step == "admit" && admits.Add(1) == 3 {
			// The long prompt's admission again, its small hold released and the first call settled.
			armCommitLost(lossy)
		}
	})
	second := send(h.gw.URL, key, longPromptBody(3000), nil)
	close(answered)
	if second.status != http.StatusServiceUnavailable || errorCode(t, second.body) != "billing_unavailable" {
		lossy.Restore()
		t.Fatalf("the long prompt, its admission again unanswered: %d %s; want 503 billing_unavailable", second.status, second.body)
	}
	awaitLog(t, logs, lossy, "admission outcome unknown", 30*time.Second)
	lossy.Restore()
	h.settled()
	runs := h.holdsOf(u.ID)
	if len(runs) != 3 {
		t.Fatalf("%d holds, want the first call's, the released small one and the lost one", len(runs))
	}
	lost := runs[2]
	if lost.State != holds.StateSettled || lost.ChargedMicro != 0 {
		t.Errorf("the lost admission's hold %s: %s charged %d, want released at 0", lost.RunID, lost.State, lost.ChargedMicro)
	}
	for _, msg := range []string{"admission outcome unknown", "request refused", "lost admission released"} {
		lines := logs.FilterMessageSnippet(msg).All()
		if len(lines) == 0 {
			if msg == "lost admission released" {
				continue // an INFO line: not observed at WARN
			}
			t.Errorf("no %q line", msg)
			continue
		}
		for _, l := range lines {
			if got := l.ContextMap()["run_id"]; got != lost.RunID {
				t.Errorf("%q names run %v, want %s, the lost admission's (the small hold released before it was %s)",
					msg, got, lost.RunID, runs[1].RunID)
			}
		}
	}
}
