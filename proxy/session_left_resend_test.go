package proxy_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageSentAgainAfterItsCallerLeftRunsWhileItsSettlementWaits: a session's call
// whose caller left mid-stream (a stop button, then "send again") never reaches answerFinal;
// its handler marks its end (endSessionCall) before its settlement. The same message sent
// while that settlement is still on its way is a new request, run, not refused 409
// already_running naming a run nobody is reading. Mutant: the handler's deferred
// endSessionCall dropped, leaving the mark to answerFinal alone.
func TestSessionMessageSentAgainAfterItsCallerLeftRunsWhileItsSettlementWaits(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	session := map[string]string{proxy.SessionHeader: "left-then-again"}
	settling, settle := h.holdAtFirst("settle")
	a := longSessionStream(t, h.gw.URL, key, "left-then-again")
	if a.StatusCode != http.StatusOK {
		t.Fatalf("A: %d", a.StatusCode)
	}
	a.Body.Close() // the caller leaves mid-stream
	select {
	case <-settling:
	case <-time.After(20 * time.Second):
		t.Fatal("A's call never reached its settlement after its caller left")
	}
	again := send(h.gw.URL, key, streamBody, session)
	settle()
	if again.status != http.StatusOK {
		t.Fatalf("the same message sent again while A's settlement waits: %d %s; want 200, run",
			again.status, again.body)
	}
}
