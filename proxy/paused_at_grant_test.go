package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallPausedAtItsHoldsGrantAndChargedIsForwarded: a plain call whose process was
// stopped right after its hold's COMMIT, past the hold's life and admit_timeout, finds once
// resumed that a peer's reconciler charged the hold what it held (reconcile_hold): it is
// forwarded, the call its caller has paid for (paidUnderAPause at the grant), and what the
// hold was charged beyond what the call used is given back (refundPausedCharge). Its
// fingerprint check, the step between the grant and the forward, runs under a budget of its
// own: under the call's own, spent, it failed at once and the paid call was answered 503. The
// pause is stood in for by holding the call at its hold's grant (step "hold granted"), the
// one step between a plain call's hold and its fingerprint check.
func TestPlainCallPausedAtItsHoldsGrantAndChargedIsForwarded(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	ctx := context.Background()
	// What the call costs unpaused: its own settlement's charge.
	used, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	before, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	calls := h.fake.Calls()
	runID, charged, done, resume := pauseAt(t, h, "hold granted", "its hold's grant", u.ID, key, chatBody, nil, holdTTL)
	resume()
	a := answerWithin(t, done)
	h.settled()
	forwardedAsPaid(t, h, a, runID, calls, "plain call paused at its hold's grant, its hold charged by a peer")
	costItsUseAlone(t, h, u.ID, runID, charged, used.ChargedMicro, before)
}

// sessionRun is the run userID's session row names now.
func sessionRun(t *testing.T, h *harness, userID uint64, sessionID string) string {
	t.Helper()
	var current string
	if err := h.db.Get(&current, "SELECT current_run_id FROM sessions WHERE user_id = ? AND session_id = ?", userID, sessionID); err != nil {
		t.Fatalf("session %s: %v", sessionID, err)
	}
	return current
}

// TestSessionMessagePausedAtItsHoldsGrantAndChargedIsForwardedWithoutTheSession: a session's
// message whose process was stopped right after its hold's COMMIT, before its claim, past the
// hold's life and admit_timeout, its hold charged by a peer's reconciler (reconcile_hold), is
// forwarded once resumed, and takes no session: its hold settled, it is no session's running
// message (paidUnderAPause). Its claim, made under the call's spent budget, failed and the
// paid call was answered 503. The session's row names the message its caller sent before
// (an older run than the paused one's), which leaves the paused message the newest: it is not
// answered superseded (sessionTakenSince).
func TestSessionMessagePausedAtItsHoldsGrantAndChargedIsForwardedWithoutTheSession(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	session := map[string]string{proxy.SessionHeader: "paused-at-grant"}
	older := sendOK(t, "the session's earlier message", h.gw.URL, key, chatBody, session)
	h.settled()
	olderRun := older.header.Get(proxy.RunIDHeader)
	calls := h.fake.Calls()
	runID, _, done, resume := pauseAt(t, h, "hold granted", "its hold's grant", u.ID, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"next"}]}`, session, holdTTL)
	resume()
	a := answerWithin(t, done)
	h.settled()
	forwardedAsPaid(t, h, a, runID, calls, "session message paused at its hold's grant, its hold charged by a peer")
	if cur := sessionRun(t, h, u.ID, "paused-at-grant"); cur != olderRun {
		t.Errorf("the session names run %s; want the earlier message's, %s: a message paid under a pause takes no session", cur, olderRun)
	}
}

// TestSessionMessagePausedAtItsHoldsGrantWhileANewerOneRanIsAnsweredSuperseded: a session's
// message whose process was stopped right after its hold's COMMIT, before its claim, its hold
// charged by a peer's reconciler (reconcile_hold), is resumed after its caller's next message
// of the session has taken the session and been answered. Forwarded, the older message would
// be answered after the newer one; it is stopped as a claim made before that message's would
// have been (sessionTakenSince): 409 superseded, not to be retried (a retry resends the older
// message over the newer), never forwarded, and its charge given back whole
// (refundPausedCharge).
func TestSessionMessagePausedAtItsHoldsGrantWhileANewerOneRanIsAnsweredSuperseded(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	ctx := context.Background()
	before, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	session := map[string]string{proxy.SessionHeader: "paused-at-grant-overtaken"}
	runID, charged, done, resume := pauseAt(t, h, "hold granted", "its hold's grant", u.ID, key, chatBody, session, holdTTL)
	newer := sendOK(t, "the session's newer message", h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"newer"}]}`, session)
	calls := h.fake.Calls()
	resume()
	a := answerWithin(t, done)
	h.settled()
	if a.status != http.StatusConflict || errorCode(t, a.body) != "superseded" || a.header.Get("X-Should-Retry") != "false" {
		t.Errorf("paused message whose session a newer one took: %d %s (X-Should-Retry %q); want 409 superseded, not to be retried",
			a.status, a.body, a.header.Get("X-Should-Retry"))
	}
	if id := a.header.Get(proxy.RunIDHeader); id != "" {
		t.Errorf("paused message refused before its forward names run %s", id)
	}
	if n := h.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls after the resume, want none (run %s paused)", n, runID)
	}
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != charged {
		t.Fatalf("the reconciler's settlement changed: %s charged %d", r.SettleSource.String, r.ChargedMicro)
	}
	refunded := grantedTo(t, h, u.ID)
	if refunded != charged {
		t.Errorf("granted back %d µUSD of a %d µUSD hold charge for a message never forwarded", refunded, charged)
	}
	after, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if spent, newerCost := before.AvailableMicro-after.AvailableMicro, h.run(u.ID, newer.header.Get(proxy.RunIDHeader)).ChargedMicro; spent != newerCost {
		t.Errorf("the two messages cost their user %d µUSD; want the newer one's alone, %d", spent, newerCost)
	}
}
