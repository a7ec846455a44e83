package e2e

import (
	"database/sql"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// sessionClaimScript is what a session claim's transaction sends first: the session row's
// upsert, which its COMMIT follows alone (armToStopAtCommitAfter).
var sessionClaimScript = [][]byte{[]byte("INSERT INTO sessions (user_id, session_id")}

// TestSessionMessagePausedAfterItsClaim: a session's message A claims its session, and its
// gateway is stopped the moment the claim's COMMIT goes out (the server commits it), before the
// forward, for longer than the hold lives and than admit_timeout. Meanwhile the caller sends a
// newer message B of the session to the peer, which answers it, and the peer's reconciler
// charges A's unleased, untallied hold what it held (reconcile_hold). Resumed, A must neither
// take the session back from B nor stop it, nor run after it: B took over as the session's
// running message, as when it comes while A runs. A is answered 409 superseded, nothing of it
// forwarded, and the charge of its hold, a call never made, is given back; B's answer is whole,
// charged its price once, and the session's row still names B.
//
// replaced: B's claim found A's hold open, replaced it and sent it a cancel, which A's process
// reads once resumed, racing A's own check. after-A-settled: B came once A's hold was settled
// and replaced nothing (no cancel): A, paid, was forwarded once resumed and answered after B.
func TestSessionMessagePausedAfterItsClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replaced bool // B is sent before A's hold is settled
	}{{"replaced", true}, {"after-A-settled", false}} {
		t.Run(tc.name, func(t *testing.T) {
			w, g, peer, key := newPausedWorld(t, "paused-claimed-"+tc.name)
			before := w.available(w.u.ID)
			hdr := map[string]string{"X-Session-Id": "chat-claimed", "X-Fake-Chunks": "12"}
			fired := w.relay.armToStopAtCommitAfter(g.cmd.Process.Pid, sessionClaimScript)
			first := make(chan seen, 1)
			go func() { first <- w.calls.call(g, key, chatRequest(false, 40, "message A, the older"), hdr) }()
			p := pausedOn(t, g, fired, "session claim's COMMIT")
			aRun := w.latestHold()()
			waitFor(t, 10*time.Second, "A's claim committed", func() bool { return w.sessionRun("chat-claimed") == aRun })
			settledA := func() bool { return w.hold(aRun).State == holds.StateSettled }
			if !tc.replaced {
				waitFor(t, 30*time.Second, "the peer's reconciler to settle A's hold", settledA)
			}
			b := w.calls.must(t, "message B, the newer, on the peer", peer, key, chatRequest(false, 40, "message B, the newer"), hdr)
			var replaced sql.NullString
			if err := w.db.Get(&replaced, "SELECT claim_replaced FROM run_holds WHERE run_id = ?", b.runID); err != nil {
				t.Fatal(err)
			}
			if tc.replaced != (replaced.String == aRun) {
				t.Fatalf("the scene did not happen: B's claim replaced %q (A is %s)", replaced.String, aRun)
			}
			waitFor(t, 30*time.Second, "the peer's reconciler to settle A's hold", settledA)
			rA := w.hold(aRun)
			if rA.SettleSource.String != holds.SourceReconcileHold || rA.ChargedMicro <= 0 {
				t.Fatalf("the scene did not happen: A's hold settled %s at %d", rA.SettleSource.String, rA.ChargedMicro)
			}
			p.resume(t)
			var a seen
			select {
			case a = <-first:
			case <-time.After(30 * time.Second):
				t.Fatal("A: no answer within 30s of the resume")
			}
			t.Logf("A got %d %s complete %v; B got %d complete %v; the upstream got %d calls", a.status, a.code, a.complete, b.status, b.complete, w.held.calls.Load())

			if cur := w.sessionRun("chat-claimed"); cur != b.runID {
				t.Errorf("the session's current run is %s after the resume, want B's %s", cur, b.runID)
			}
			rB := w.hold(b.runID)
			if want := min(w.price.Cost(b.usage), rB.CapMicro); rB.SettleSource.String != holds.SourceComplete || rB.ChargedMicro != want {
				t.Errorf("B: %s charged %d, want complete at its price %d", rB.SettleSource.String, rB.ChargedMicro, want)
			}
			if after := w.hold(aRun); after.ChargedMicro != rA.ChargedMicro || after.SettleSource != rA.SettleSource {
				t.Errorf("A's settlement changed after the resume: %s charged %d, was %s charged %d", after.SettleSource.String, after.ChargedMicro, rA.SettleSource.String, rA.ChargedMicro)
			}
			if a.complete || a.code != "superseded" {
				t.Errorf("A, whose session B took while A's gateway was stopped: %d %s complete %v, want 409 superseded", a.status, a.code, a.complete)
			}
			if n := w.held.calls.Load(); n != 1 {
				t.Errorf("the upstream got %d calls, want B's alone", n)
			}
			refunded := w.pauseRefund(t, aRun, "the charge of A, never made")
			if refunded != rA.ChargedMicro {
				t.Errorf("granted back %d µUSD, want A's charge %d", refunded, rA.ChargedMicro)
			}
			w.books(t, rA.ChargedMicro+rB.ChargedMicro)
			after := w.available(w.u.ID)
			if want := before - rA.ChargedMicro - rB.ChargedMicro + refunded; after != want {
				t.Errorf("available %d µUSD after the resume, want %d: %d before, less what A and B were charged, plus %d given back",
					after, want, before, refunded)
			}
		})
	}
}

// sessionRun is the current run of the world's first user's session id, "" for none.
func (w *pausedWorld) sessionRun(id string) string {
	var cur string
	_ = w.db.Get(&cur, "SELECT COALESCE(MAX(current_run_id), '') FROM sessions WHERE user_id = ? AND session_id = ?", w.u.ID, id)
	return cur
}
