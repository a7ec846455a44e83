package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestSmallHoldChargedDuringAPauseBeforeItsReleaseIsRefunded: a long prompt's hold, granted
// while its user's answered call settled and too small for it, is released at 0 before the
// call waits for that settlement (releaseUnfit). Between the hold's COMMIT and its refusal's mark
// the hold is running with no lease, no tally and no mark: a process stopped there (SIGSTOP, a
// VM's live migration) past hold_ttl or holds.dead_instance_after has it charged what it held by
// a peer's reconciler (reconcile_hold), and its release, once resumed, finds it settled and
// changes nothing. Nothing was forwarded on that hold: the caller paid it for nothing, beside
// the call it was then admitted again for. Its charge is given back as that of a call never
// forwarded is (refundPausedCharge): a grant keyed by its run, pause-refund:{run_id}.
//
// The pause is stood in for by holding the release at the refusal's mark, the hold settled
// under it as the reconciler settles it.
func TestSmallHoldChargedDuringAPauseBeforeItsReleaseIsRefunded(t *testing.T) {
	h := newHarness(t, aLittleOverTheTier)
	u, key := h.user("standard")
	answered := make(chan struct{})
	var small atomic.Value
	firstSettlementHeld(h, answered, func(_ context.Context, step string) {
		if step != "refused mark" || small.Load() != nil {
			return
		}
		runID, _, err := chargeRunningHoldAsTheReconciler(h, u.ID)
		if err != nil {
			t.Errorf("the small hold: %v", err)
			return
		}
		small.Store(runID)
	})
	sendOK(t, "first call", h.gw.URL, key, chatBody, nil)
	long := send(h.gw.URL, key, longPromptBody(3000), nil)
	close(answered)
	h.settled()
	runID, _ := small.Load().(string)
	if runID == "" {
		t.Fatalf("the long prompt's small hold was never released (%d %s): the test's premise", long.status, long.body)
	}
	wantPauseRefund(t, h, u.ID, runID)
}

// TestLostAdmissionChargedDuringAPauseBeforeItsMarkIsRefunded: a call whose admission committed
// with its reply lost is refused 503 and its hold released at 0 (releaseLostAdmission), after
// the mark of its refusal that the reconciler reads should the release never land. A process
// stopped before that mark past the hold's life has the hold, unleased, untallied and unmarked,
// charged what it held by a peer's reconciler (reconcile_hold): the release, once resumed,
// finds it settled and changes nothing, and the caller told 503 "not made, retry" paid its hold
// for nothing and its retry again. The charge is given back by the grant keyed by the run, for
// a plain call and an Idempotency-Key attempt alike (whose run is its key's: only the hold
// carrying the refused admission's token is refunded).
//
// The pause is stood in for by holding the call at its refusal's mark, the database back and
// the hold settled under it as the reconciler settles it.
func TestLostAdmissionChargedDuringAPauseBeforeItsMarkIsRefunded(t *testing.T) {
	for name, hdr := range map[string]map[string]string{
		"plain":           nil,
		"idempotency-key": {proxy.IdempotencyKeyHeader: "paused-lost-" + testenv.RandomID(4)},
	} {
		t.Run(name, func(t *testing.T) {
			h, lossy, _ := newObservedLossyHarness(t, nil)
			defer lossy.Restore()
			u, key := h.user("standard")
			var charged atomic.Value
			h.srv.ObserveSteps(func(_ context.Context, step string) {
				if step != "refused mark" || charged.Load() != nil {
					return
				}
				lossy.Restore()
				runID, _, err := chargeRunningHoldAsTheReconciler(h, u.ID)
				if err != nil {
					t.Errorf("the refused call's hold: %v", err)
					return
				}
				charged.Store(runID)
			})
			postRefusedWithCommitLost(t, h, lossy, key, hdr)
			h.settled()
			runID, _ := charged.Load().(string)
			if runID == "" {
				t.Fatal("the refused call's hold was never charged at its mark: the test's premise")
			}
			wantPauseRefund(t, h, u.ID, runID)
		})
	}
}

// wantPauseRefund checks that userID's hold runID stands charged by the reconciler
// (reconcile_hold, above 0) and that all of that charge was given back by the one grant keyed
// by the run: a hold charged while its process was stopped, never forwarded on.
func wantPauseRefund(t *testing.T, h *harness, userID uint64, runID string) {
	t.Helper()
	r := h.run(userID, runID)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the refused call's hold %s: %s by %q charged %d, want the reconciler's charge to stand", runID, r.State, r.SettleSource.String, r.ChargedMicro)
	}
	charged := r.ChargedMicro
	var grants []struct {
		Key    string `db:"idempotency_key"`
		Amount int64  `db:"amount_micro"`
	}
	if err := h.db.Select(&grants, "SELECT idempotency_key, amount_micro FROM grants WHERE user_id = ?", userID); err != nil {
		t.Fatal(err)
	}
	if len(grants) != 1 || grants[0].Key != "pause-refund:"+runID || grants[0].Amount != charged {
		t.Errorf("grants %+v; want one of %d µUSD keyed pause-refund:%s: a hold charged while its process was stopped, never forwarded on",
			grants, charged, runID)
	}
}

// chargeRunningHoldAsTheReconciler settles userID's newest running hold as a peer's reconciler
// settles the hold of a process it took for dead (reconcile_hold): charged what it held. It
// returns the hold's run and that charge, and fails unless the charge was applied and above 0,
// the scene of a pause refund.
func chargeRunningHoldAsTheReconciler(h *harness, userID uint64) (runID string, charged int64, err error) {
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ? AND state = 'running' ORDER BY created_at DESC LIMIT 1", userID); err != nil {
		return "", 0, fmt.Errorf("the running hold of user %d: %w", userID, err)
	}
	res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: runID, UserID: userID, Source: holds.SourceReconcileHold,
		ChargeHeld: true, Estimated: true})
	if err != nil || !res.Applied || res.ChargedMicro <= 0 {
		return "", 0, fmt.Errorf("settle %s as the reconciler would: %+v %v", runID, res, err)
	}
	return runID, res.ChargedMicro, nil
}

// chargedThroughItsPause waits until the paused call is reached, charges its hold as a peer's
// reconciler would (chargeRunningHoldAsTheReconciler), then returns once the pause has
// outlasted the hold's life from sent, as it must have for a reconciler to charge it. what
// names the pause for the failure when it is never reached.
func chargedThroughItsPause(t *testing.T, h *harness, userID uint64, reached <-chan struct{}, what string,
	sent time.Time, holdTTL time.Duration) (runID string, charged int64) {
	t.Helper()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatalf("the call never reached %s", what)
	}
	runID, charged, err := chargeRunningHoldAsTheReconciler(h, userID)
	if err != nil {
		t.Fatalf("the paused call's hold: %v", err)
	}
	time.Sleep(time.Until(sent.Add(holdTTL + 100*time.Millisecond)))
	return runID, charged
}

// pausedHarness is a gateway whose holds live 2 s (the holdTTL it returns) and whose
// admissions get 1 s: a call held at a step (pauseAt) past its hold's life from its arrival
// has outlived both, as a process stopped there would have, and a peer's reconciler may have
// charged its hold (chargedThroughItsPause). tweaks apply to its configuration after its own.
func pausedHarness(t *testing.T, tweaks ...func(*config.Config)) (*harness, time.Duration) {
	const holdTTL = 2 * time.Second
	return newHarness(t, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = holdTTL, time.Second, time.Second
		for _, tweak := range tweaks {
			tweak(c)
		}
	}), holdTTL
}

// pauseAt sends body under hdr and holds it at its first step named step (what names it for a
// failure) past its hold's life from its arrival, its hold charged meanwhile by a peer's
// reconciler (chargedThroughItsPause). It returns the paused call's run, that charge, its
// answer to come (answerWithin) and the resume.
func pauseAt(t *testing.T, h *harness, step, what string, userID uint64, key, body string, hdr map[string]string,
	holdTTL time.Duration) (runID string, charged int64, done <-chan answer, resume func()) {
	t.Helper()
	reached, resume := h.holdAtFirst(step)
	ch := make(chan answer, 1)
	sent := time.Now()
	go func() { ch <- send(h.gw.URL, key, body, hdr) }()
	runID, charged = chargedThroughItsPause(t, h, userID, reached, what, sent, holdTTL)
	return runID, charged, ch, resume
}

// answerWithin waits for a paused call's answer after its resume.
func answerWithin(t *testing.T, done <-chan answer) answer {
	t.Helper()
	select {
	case a := <-done:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after the resume")
		return answer{}
	}
}

// forwardedAsPaid checks the answer a of a paused call whose hold a peer charged (what names
// it for a failure): 200 under its own run, runID, and one upstream call since calls, its own
// — the call its caller paid for.
func forwardedAsPaid(t *testing.T, h *harness, a answer, runID string, calls int64, what string) {
	t.Helper()
	if a.status != http.StatusOK || a.header.Get(proxy.RunIDHeader) != runID {
		t.Errorf("%s: %d %s (run %q, paused %s); want 200, the call it paid for",
			what, a.status, a.body, a.header.Get(proxy.RunIDHeader), runID)
	}
	if n := h.fake.Calls() - calls; n != 1 {
		t.Errorf("%s: %d upstream calls after the resume, want its own", what, n)
	}
}

// costItsUseAlone checks what a paused call forwarded after a peer's reconciler charged its
// hold (charged, on runID) cost userID since before: the reconciler's settlement left as it
// was, what it charged beyond the call's use (used, the call's cost unpaused) given back, and
// so the user down by used alone.
func costItsUseAlone(t *testing.T, h *harness, userID uint64, runID string, charged, used int64, before holds.Balance) {
	t.Helper()
	if r := h.run(userID, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != charged {
		t.Fatalf("the reconciler's settlement changed: %s charged %d", r.SettleSource.String, r.ChargedMicro)
	}
	if refunded, want := grantedTo(t, h, userID), charged-used; refunded != want {
		t.Errorf("granted back %d µUSD of a %d µUSD hold charge for a call that used %d; want %d", refunded, charged, used, want)
	}
	after, err := h.store.Balance(context.Background(), userID)
	if err != nil {
		t.Fatal(err)
	}
	if spent := before.AvailableMicro - after.AvailableMicro; spent != used {
		t.Errorf("the call cost its user %d µUSD; unpaused it costs %d", spent, used)
	}
}

// TestLostAdmissionChargedDuringAPauseWhoseReleaseFailsIsRefunded: as
// TestLostAdmissionChargedDuringAPauseBeforeItsMarkIsRefunded, but the database stays out of
// reach after the resume for as long as the release at 0 keeps trying (the hold's life): the
// release gives up, and the hold a peer's reconciler charged whole (reconcile_hold) while the
// process was stopped is never read again, by the reconciler (which settles only runs still
// open) nor by anyone: "the reconciler will settle it" was the line left, and the caller told
// 503 paid its hold for a call never made. The run is read again once the release has given up,
// as a call's failed settlement reads it (refundAfterFailedSettlement), and the charge given
// back by the run's pause-refund grant. The database is stood back up at that read.
func TestLostAdmissionChargedDuringAPauseWhoseReleaseFailsIsRefunded(t *testing.T) {
	h, lossy, _ := newObservedLossyHarness(t, func(c *config.Config) {
		// The release keeps trying for the hold's life: short, so that it gives up soon.
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval = 2*time.Second, time.Second
	})
	defer lossy.Restore()
	u, key := h.user("standard")
	var charged atomic.Value
	var refundRead atomic.Bool
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch {
		case step == "refused mark" && charged.Load() == nil:
			// Resumed past the hold's life: a peer charged it meanwhile; the database is out of
			// reach again for the release.
			lossy.Restore()
			runID, _, err := chargeRunningHoldAsTheReconciler(h, u.ID)
			if err != nil {
				t.Errorf("the refused call's hold: %v", err)
				return
			}
			charged.Store(runID)
			lossy.TakeDown()
		case step == "refund" && charged.Load() != nil:
			refundRead.Store(true)
			lossy.Restore()
		}
	})
	postRefusedWithCommitLost(t, h, lossy, key, nil)
	h.settled()
	lossy.Restore()
	runID, _ := charged.Load().(string)
	if runID == "" {
		t.Fatal("the refused call's hold was never charged at its mark: the test's premise")
	}
	wantPauseRefund(t, h, u.ID, runID)
	if !refundRead.Load() {
		t.Error("the run was not read again once its release gave up")
	}
}
