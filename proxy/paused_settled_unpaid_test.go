package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPausedCallWhoseHoldWasSettledAtZeroIsNotForwarded: a call whose process was stopped
// between its hold's COMMIT and its forward, past hold_ttl and admit_timeout, is forwarded once
// resumed only if another process charged its hold meanwhile (paidUnderAPause): it is then the
// call its caller has paid for. A hold another process settled at 0 (released: nothing charged)
// paid for nothing: the call is refused as late, 503 billing_unavailable, "not made, retry",
// and nothing reaches the upstream — forwarded, its caller got a call for free, its answer's
// cost charged to nobody (its own settlement finds the hold settled and changes nothing).
//
// The pause is stood in for by holding the call at its attempt's admission (an Idempotency-Key
// call: the one step between a plain call's hold and its forward a test can hold it at), its
// hold released at 0 under it.
func TestPausedCallWhoseHoldWasSettledAtZeroIsNotForwarded(t *testing.T) {
	h, holdTTL := pausedHarness(t)
	u, key := h.user("standard")
	ctx := context.Background()
	before, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	reached, resume := h.holdAtFirst("attempt admitted")
	done := make(chan answer, 1)
	sent := time.Now()
	go func() {
		done <- send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "paused-released-" + testenv.RandomID(4)})
	}()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached its attempt's admission")
	}
	var runID string
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ? AND state = 'running'", u.ID); err != nil {
		t.Fatalf("the paused call's running hold: %v", err)
	}
	if res, err := h.store.Settle(ctx, holds.Settlement{RunID: runID, UserID: u.ID, Source: holds.SourceRelease}); err != nil || !res.Applied || res.ChargedMicro != 0 {
		t.Fatalf("release %s at 0 as another process would: %+v %v", runID, res, err)
	}
	// The pause outlasts the hold's life from the call's arrival, as it must for another
	// process to have settled the hold: paidUnderAPause reads the hold only then.
	time.Sleep(time.Until(sent.Add(holdTTL + 100*time.Millisecond)))
	calls := h.fake.Calls()
	resume()
	a := answerWithin(t, done)
	h.settled()
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
		t.Errorf("paused call whose hold was settled at 0: %d %s; want 503 billing_unavailable (not made, nothing paid for)", a.status, a.body)
	}
	if n := h.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls after the resume, want none: a hold settled at 0 paid for no call", n)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceRelease || r.ChargedMicro != 0 {
		t.Errorf("hold %s: %s by %q charged %d, want it left released at 0", runID, r.State, r.SettleSource.String, r.ChargedMicro)
	}
	after, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.AvailableMicro != before.AvailableMicro {
		t.Errorf("available %d µUSD after a call never made, %d before it", after.AvailableMicro, before.AvailableMicro)
	}
}

// TestNamedRunCallPausedWhileItsRunWasSettledIsNotForwarded: a named run's call whose process
// was stopped between its hold's COMMIT and its forward, past run_ttl and admit_timeout, finds
// its run settled once resumed. Only a run a peer's reconciler charged what it held
// (reconcile_hold: none of its calls known to have been made) paid for this call
// (paidUnderAPause); a run settled from its tally (its earlier calls: this call charged
// nothing) or by its agent (POST /v1/runs/{name}/settle: closed) did not, and the call is
// refused as late, 503 billing_unavailable, nothing forwarded, the run charged its earlier
// call alone. Forwarded, the call was made for free: a run settled from its tally is not
// closed in Redis, so its reservation went through.
//
// The pause is stood in for by the admission's reply coming late (testenv.Lossy.ArmLate on the
// write that pushes the run's expiry out, once the server has committed it): a named run's call
// has no step between its hold's COMMIT and the check at its grant that a test can hold it at,
// and the one after (its run budget reservation) runs under the admission's budget, so a call
// held there is refused by the reservation itself before the check before forwarding. The run
// is settled while the reply is held back, and the test checks that it was settled before the
// reply could have come (the late reply returns no sooner than late after its write).
func TestNamedRunCallPausedWhileItsRunWasSettledIsNotForwarded(t *testing.T) {
	for _, tc := range []struct {
		name, source string
		settle       func(t *testing.T, h *harness, key, name string, run holds.Run)
	}{
		{"settled from its tally", holds.SourceReconcile, func(t *testing.T, h *harness, _, _ string, run holds.Run) {
			// As a peer's reconciler settles an expired run whose tally it read: its earlier call.
			res, err := h.store.Settle(context.Background(), holds.Settlement{RunID: run.RunID, UserID: run.UserID,
				Source: holds.SourceReconcile, CostMicro: run.CostMicro, Calls: run.Calls})
			if err != nil || !res.Applied {
				t.Fatalf("settle %s from its tally as the reconciler would: %+v %v", run.RunID, res, err)
			}
		}},
		{"settled by its agent", holds.SourceClient, func(t *testing.T, h *harness, key, name string, _ holds.Run) {
			if status, body := h.settleRun(key, name); status != http.StatusOK {
				t.Fatalf("the agent's settle: %d %s", status, body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const runTTL = 2 * time.Second
			// How late the admission's reply is: past run_ttl, the soonest a peer may settle
			// the run (paidUnderAPause reads the hold only then), with room for the settle.
			const late = runTTL + 2*time.Second
			dsn, lossy := testenv.LossyMySQLDSN(t)
			h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
				c.Holds.RunTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = runTTL, time.Second, time.Second
			})
			u, key := h.user("standard")
			name := "paused-" + testenv.RandomID(4)
			hdr := map[string]string{"X-Run-Id": name}
			sendOK(t, "the run's first call", h.gw.URL, key, chatBody, hdr)
			runID := proxy.RunIDFor(u.ID, name)
			first := h.run(u.ID, runID)
			if first.State != holds.StateRunning || first.CostMicro <= 0 {
				t.Fatalf("run after its first call: %s, recorded %d µUSD; want it running with its call recorded", first.State, first.CostMicro)
			}
			var armed atomic.Bool
			h.srv.ObserveSteps(func(_ context.Context, step string) {
				if step == "admit" && armed.CompareAndSwap(false, true) {
					lossy.ArmLate("UPDATE run_holds SET expires_at = GREATEST", late)
				}
			})
			calls := h.fake.Calls()
			done := make(chan answer, 1)
			sent := time.Now()
			go func() { done <- send(h.gw.URL, key, chatBody, hdr) }()
			// The second call's admission has committed once the run's expiry moved out.
			for deadline := time.Now().Add(10 * time.Second); ; {
				var expires time.Time
				if err := h.db.Get(&expires, "SELECT expires_at FROM run_holds WHERE run_id = ?", runID); err != nil {
					t.Fatal(err)
				}
				if expires.After(first.ExpiresAt) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the run's second call was never admitted")
				}
				time.Sleep(10 * time.Millisecond)
			}
			tc.settle(t, h, key, name, first)
			if time.Now().After(sent.Add(late)) {
				t.Fatal("the run was settled after the second call's admission could have answered: the test's premise")
			}
			var a answer
			select {
			case a = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("no answer to the run's second call")
			}
			if !lossy.Fired() {
				t.Fatal("the second call's admission was not answered late: the test's premise")
			}
			h.settled()
			if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
				t.Errorf("named run's call paused while its run was %s: %d %s; want 503 billing_unavailable (not made: its run paid nothing for it)",
					tc.name, a.status, a.body)
			}
			if n := h.fake.Calls() - calls; n != 0 {
				t.Errorf("%d upstream calls for the paused call, want none: its run, %s, charged nothing for it", n, tc.name)
			}
			r := h.run(u.ID, runID)
			if r.State != holds.StateSettled || r.SettleSource.String != tc.source || r.ChargedMicro != first.CostMicro {
				t.Errorf("run %s: %s by %q charged %d µUSD; want it settled by %q at its first call's %d", runID, r.State,
					r.SettleSource.String, r.ChargedMicro, tc.source, first.CostMicro)
			}
			if granted := grantedTo(t, h, u.ID); granted != 0 {
				t.Errorf("granted back %d µUSD: the paused call was never charged", granted)
			}
		})
	}
}
