package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
)

// TestSessionMessageRefusedWithItsClaimUnknownCanBeSentAgain: a session's message R whose claim
// took the session from a running message A, committed with its COMMIT reply lost, and gave up
// (503 billing_unavailable once the admission budget was spent) is the session's current run,
// its hold live until its release at 0 reaches the database. R never runs, yet nothing marked
// it ended: the same message sent again meanwhile — the retry the 503 invites, here through a
// gateway that reaches the database — was refused 409 already_running, with X-Should-Retry:
// false, naming a run that will never answer. R's refusal now marks its end, as any refusal
// after a committed claim does, and the resend runs. A, which R's committed attempt replaced,
// is still stopped once the database answers again.
func TestSessionMessageRefusedWithItsClaimUnknownCanBeSentAgain(t *testing.T) {
	sc := newClaimLostScene(t, nil, func(h *harness) runstate.Keys { return h.keys })
	if got := <-sc.r; got.status != http.StatusServiceUnavailable {
		t.Fatalf("R, its claim's COMMIT unanswered for the whole admission budget: %d %s, want 503", got.status, got.body)
	}
	var r string
	if err := sc.plain.Get(&r, "SELECT current_run_id FROM sessions WHERE user_id = ?", sc.userID); err != nil {
		t.Fatal(err)
	}
	// The first gateway still cannot reach the database: R's hold awaits its release.
	var state string
	if err := sc.plain.Get(&state, "SELECT state FROM run_holds WHERE run_id = ?", r); err != nil || state != "running" {
		t.Fatalf("R's hold is %q (%v), want still running (its release not landed)", state, err)
	}
	sendOK(t, "R sent again after its 503", sc.other, sc.key, `{"model":"fake-gpt","messages":[{"role":"user","content":"R: another question"}]}`, sc.session)
	sc.lossy.Restore()
	sc.aStopped(t, "A, replaced by the committed attempt of R's failed claim")
}
