package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageWhoseCallerLeftAtItsFinalEventRunsWhenSentAgain: a session's stream whose
// caller leaves once the final event is in hand, the cancel landing before answerFinal gives
// back what the call claimed against duplicates, still has its answer whole: answerFinal marks
// the session's call ended under a context of its own, not the caller's ended one. The same
// message sent again while the call's settlement is on its way is a new request, run, not
// refused 409 already_running naming a run nobody is reading; the left call settles. Mutants:
// the mark written under the caller's ended context (it fails, and the handler's end finds the
// call no longer claimed), or skipped when that context has ended.
func TestSessionMessageWhoseCallerLeftAtItsFinalEventRunsWhenSentAgain(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	session := map[string]string{proxy.SessionHeader: "left-at-final-event"}
	leftCtx, leave := context.WithCancel(context.Background())
	defer leave()
	atFinal, settling, letSettle := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var letOnce atomic.Bool
	release := func() {
		if letOnce.CompareAndSwap(false, true) {
			close(letSettle)
		}
	}
	t.Cleanup(release)
	var finals, settles atomic.Int32
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		switch step {
		case "final event":
			if finals.Add(1) != 1 {
				return
			}
			// The caller leaves here, and the gateway sees it before answerFinal runs.
			leave()
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Second):
				t.Errorf("the gateway never saw the caller leave at the final event")
			}
			close(atFinal)
		case "settle":
			if settles.Add(1) == 1 {
				close(settling)
				<-letSettle
			}
		}
	})
	first := make(chan answer, 1)
	go func() { first <- sendToCtx(leftCtx, h.gw.URL, "/v1/chat/completions", key, streamBody, session) }()
	reach(t, atFinal, "the first call's final event")
	reach(t, settling, "the left call's settlement")
	<-first
	var aRun string
	if err := h.db.Get(&aRun, "SELECT current_run_id FROM sessions WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	again := send(h.gw.URL, key, streamBody, session)
	release()
	if again.status != http.StatusOK {
		t.Fatalf("the same message sent again while the left call's settlement waits: %d %s; want 200, run",
			again.status, again.body)
	}
	if againRun := again.header.Get(proxy.RunIDHeader); againRun == aRun {
		t.Fatalf("the message sent again ran as the left call, %s: want a run of its own", aRun)
	}
	h.waitSettled(aRun, 20*time.Second, "its caller left after its final event")
	h.settled()
	if run := h.run(u.ID, aRun); run.OutTok == 0 {
		t.Errorf("the left call, its answer whole, = %+v; want it charged its output", run)
	}
}
