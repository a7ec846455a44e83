package e2e

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestSessionMessagePausedBeforeItsClaimAndANewerOne: a session's message A is caught by the
// pause between its hold's COMMIT and its claim (TestSessionCallPausedBetweenItsHoldAndTheForward's
// scene), and the peer's reconciler charges its hold what it held (reconcile_hold).
//
// newer: meanwhile the caller sends a newer message B of the session to the peer, which claims
// the session and answers it. Resumed, A, paid, was forwarded without a claim and answered
// after B, its caller's latest: the older message run after the newer, as a claim that found B
// would never have let it. A must be refused 409 superseded instead, as if it had claimed the
// session before B came (TestSessionMessagePausedAfterItsClaim): nothing of it forwarded, the
// charge of its hold given back; B keeps the session, charged its price once.
//
// older: the session's row names a message C answered before A was sent. A, the newest, is
// forwarded once resumed and answered whole, as with no row at all.
func TestSessionMessagePausedBeforeItsClaimAndANewerOne(t *testing.T) {
	for _, tc := range []struct {
		name  string
		newer bool // B comes during the pause; else C came before A
	}{{"newer", true}, {"older", false}} {
		t.Run(tc.name, func(t *testing.T) {
			w, g, peer, key := newPausedWorld(t, "paused-unclaimed-"+tc.name)
			hdr := map[string]string{"X-Session-Id": "chat-unclaimed", "X-Fake-Chunks": "12"}
			var other seen
			if !tc.newer {
				other = w.calls.must(t, "message C, before A, on the peer", peer, key, chatRequest(false, 40, "message C, the older"), hdr)
			}
			before := w.available(w.u.ID)
			aRun := func() string {
				var id string
				_ = w.db.Get(&id, "SELECT COALESCE(MAX(run_id), '') FROM run_holds WHERE user_id = ? AND run_id <> ?", w.u.ID, other.runID)
				return id
			}
			calledBefore := w.held.calls.Load()
			a, rA := pausedBeforeForwardWhile(t, w, g, key, hdr, aRun, func() {
				if tc.newer {
					other = w.calls.must(t, "message B, the newer, on the peer", peer, key, chatRequest(false, 40, "message B, the newer"), hdr)
				}
			})
			if rA.SettleSource.String != holds.SourceReconcileHold || rA.ChargedMicro <= 0 {
				t.Fatalf("the scene did not happen: A's hold settled %s at %d", rA.SettleSource.String, rA.ChargedMicro)
			}
			if cur := w.sessionRun("chat-unclaimed"); cur != other.runID {
				t.Errorf("the session's current run is %s after the resume, want the other message's %s", cur, other.runID)
			}
			called := w.held.calls.Load() - calledBefore
			if !tc.newer {
				if !a.complete || called != 1 {
					t.Errorf("A, the newest message: %d %s complete %v, the upstream got %d calls: want it answered whole", a.status, a.code, a.complete, called)
				}
				return
			}
			if a.complete || a.code != "superseded" {
				t.Errorf("A, whose session B took while A's gateway was stopped: %d %s complete %v, want 409 superseded (the upstream got %d calls)", a.status, a.code, a.complete, called)
			}
			if called != 1 {
				t.Errorf("the upstream got %d calls, want B's alone", called)
			}
			rB := w.hold(other.runID)
			if want := min(w.price.Cost(other.usage), rB.CapMicro); rB.SettleSource.String != holds.SourceComplete || rB.ChargedMicro != want {
				t.Errorf("B: %s charged %d, want complete at its price %d", rB.SettleSource.String, rB.ChargedMicro, want)
			}
			refunded := w.pauseRefund(t, rA.RunID, "the charge of A, never made")
			if refunded != rA.ChargedMicro {
				t.Errorf("granted back %d µUSD, want A's charge %d", refunded, rA.ChargedMicro)
			}
			w.books(t, rA.ChargedMicro+rB.ChargedMicro)
			after := w.available(w.u.ID)
			if want := before - rB.ChargedMicro; after != want {
				t.Errorf("available %d µUSD after the resume, want %d: %d before, less B's price", after, want, before)
			}
		})
	}
}
