package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestRefusedAdmissionKilledBeforeItsPauseRefundIsRefundedByTheReconciler: an admission
// refused after its hold's COMMIT — a hold too small for its prompt (releaseUnfit), a lost
// admission of an Idempotency-Key attempt (releaseLostAdmission) — whose process was stopped
// between that COMMIT and its refusal's mark past the hold's life has the hold charged what it
// held by a peer's reconciler (reconcile_hold). Resumed, the process marks, its release at 0
// finds the run settled, and its refund of the whole charge (refundUnforwardedHold) is what
// gives it back — until the process is killed before that grant. Neither hold has a tally
// (an attempt's run may be another request's; a too-small hold's release writes none): only
// the mark. A pass reads it as the scan would have, had it been there, and grants the whole
// charge under pause-refund:{run_id}, once; the caller is answered as ever, and the refused
// hold costs its user nothing.
//
// The pause is stood in for by holding the call at its refusal's mark, the hold settled under
// it as the reconciler settles it. The kill is stood in for by the refund's grant never
// reaching the database (every statement naming its key refused 1047 before it runs, for all
// the refund's settle_timeout): what a kill between the release and the grant leaves. The
// pass comes once the process is done with the refused call.
func TestRefusedAdmissionKilledBeforeItsPauseRefundIsRefundedByTheReconciler(t *testing.T) {
	for _, tc := range []struct {
		name string
		// tweak sets the harness up for the case's scene; call sends the refused call and
		// checks its answer, atMark told of the gateway's steps as the case's neighbour test's
		// observer is.
		tweak func(*config.Config)
		call  func(t *testing.T, h *harness, lossy *testenv.Lossy, key string, atMark func(context.Context, string))
	}{
		{
			// TestSmallHoldChargedDuringAPauseBeforeItsReleaseIsRefunded's scene. The call,
			// its small hold released, is admitted again once the settlement it waited for has
			// landed, and served. Its admission's budget outlasts the failed refund's
			// settle_timeout, spent in the request.
			name: "hold too small for its prompt",
			tweak: func(c *config.Config) {
				aLittleOverTheTier(c)
				c.Limits.AdmitTimeout = 5 * time.Second
			},
			call: func(t *testing.T, h *harness, _ *testenv.Lossy, key string, atMark func(context.Context, string)) {
				answered := make(chan struct{})
				firstSettlementHeld(h, answered, atMark)
				sendOK(t, "first call", h.gw.URL, key, chatBody, nil)
				long := send(h.gw.URL, key, longPromptBody(3000), nil)
				close(answered)
				if long.status != http.StatusOK {
					t.Errorf("the long prompt, its small hold released and admitted again: %d %s; want 200", long.status, long.body)
				}
			},
		},
		{
			// TestLostAdmissionChargedDuringAPauseBeforeItsMarkIsRefunded's scene: refused 503.
			name: "lost admission of an Idempotency-Key attempt",
			call: func(t *testing.T, h *harness, lossy *testenv.Lossy, key string, atMark func(context.Context, string)) {
				h.srv.ObserveSteps(atMark)
				postRefusedWithCommitLost(t, h, lossy, key,
					map[string]string{proxy.IdempotencyKeyHeader: "paused-lost-killed-" + testenv.RandomID(4)})
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, lossy, logs := newObservedLossyHarness(t, tc.tweak)
			defer lossy.Restore()
			u, key := h.user("standard")
			ctx := context.Background()
			before, err := h.store.Balance(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			var charged atomic.Value
			atMark := func(_ context.Context, step string) {
				if step != "refused mark" || charged.Load() != nil {
					return
				}
				lossy.Restore() // a lost admission's network went down with its COMMIT's reply
				runID, _, err := chargeRunningHoldAsTheReconciler(h, u.ID)
				if err != nil {
					t.Errorf("the refused call's hold: %v", err)
					return
				}
				charged.Store(runID)
				// Killed before the refund's grant: it never lands.
				lossy.ArmN(holds.PauseRefundKey(runID), testenv.NotReadyReply, 1_000_000)
			}
			tc.call(t, h, lossy, key, atMark)
			h.settled()
			killed := lossy.Fired()
			lossy.Restore()
			runID, _ := charged.Load().(string)
			if runID == "" {
				t.Fatal("the refused call's hold was never charged at its mark: the test's premise")
			}
			if !killed {
				t.Fatal("the process's refund never reached its grant: the test's premise")
			}
			// The release found the run settled (refundUnforwardedHold), not a release that
			// failed and read it again (refundAfterFailedRelease): the database was back.
			if n := logs.FilterMessageSnippet("not released").Len() + logs.FilterMessageSnippet("prompt failed").Len(); n != 0 {
				t.Fatalf("%d lines of a release that failed: the test's premise is one that found the run settled", n)
			}
			var grants int
			if err := h.db.Get(&grants, "SELECT COUNT(*) FROM grants WHERE user_id = ?", u.ID); err != nil || grants != 0 {
				t.Fatalf("%d grants (%v) before the pass; the process's refund was to be lost", grants, err)
			}

			rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally}, Leases: noLeases{},
				Refusals: h.tally, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute, RefundWindow: time.Hour})
			// A second pass grants nothing more: the refund is once.
			for pass := 1; pass <= 2 && !t.Failed(); pass++ {
				if st, err := rec.RunOnce(ctx); err != nil {
					t.Fatalf("reconcile pass %d: %+v, %v", pass, st, err)
				}
				wantPauseRefund(t, h, u.ID, runID)
			}

			// The refused hold costs nothing in the end: what the user spent is what its other
			// runs (the case's answered calls) were charged.
			var others int64
			for _, r := range h.holdsOf(u.ID) {
				if r.State != holds.StateSettled {
					t.Errorf("run %s is %s; want all settled", r.RunID, r.State)
				}
				if r.RunID != runID {
					others += r.ChargedMicro
				}
			}
			after, err := h.store.Balance(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if spent := before.AvailableMicro - after.AvailableMicro; spent != others {
				t.Errorf("the user spent %d µUSD; want %d, what its answered calls were charged: the refused hold nothing", spent, others)
			}
		})
	}
}
