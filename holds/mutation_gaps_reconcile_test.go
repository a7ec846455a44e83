package holds_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// Tests of the revisit of runs charged their hold (refundPaused) that no other test pins: each
// was written against a hand-made change of holds/pause_refund.go that every earlier test let
// pass (a mutation test). Each scene is a one-call hold a pass charged what it held
// (reconcile_hold), then what its call's process wrote after the charge.

// chargedHeld admits a one-call run for u, expires it and has rec's pass charge it what it
// held (no lease, no tally), and returns the run as settled.
func (e *storeEnv) chargedHeld(rec *holds.Reconciler, u holds.User, runID string) holds.Run {
	e.t.Helper()
	e.admit(u, runID, holds.StateRunning)
	e.expire(runID)
	if _, err := e.pass(rec); err != nil {
		e.t.Fatal(err)
	}
	r := e.run(u, runID)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 900 {
		e.t.Fatalf("%s: %s by %q charged %d; the scene is a hold charged what it held, above the call's 900", runID, r.State,
			r.SettleSource.String, r.ChargedMicro)
	}
	return r
}

// pauseRefunds is the amounts of the grants keyed runID's pause refund.
func (e *storeEnv) pauseRefunds(runID string) []int64 {
	e.t.Helper()
	var grants []int64
	if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(runID)); err != nil {
		e.t.Fatal(err)
	}
	return grants
}

// unreadableLeases is a lease checker whose Redis does not answer.
type unreadableLeases struct{}

func (unreadableLeases) Exists(context.Context, string) (bool, error) {
	return false, errors.New("redis: i/o timeout")
}

// TestReconcileRevisitLeavesARunWhoseLeaseCannotBeRead: a lease that cannot be read may be a
// live process's, which refunds the run at its own figures (its tally's may still be its final
// event's): the revisit leaves the run for a pass that can read it, as the scan leaves a hold.
// Taken for "no lease", the pass refunded on figures the process may yet set right.
func TestReconcileRevisitLeavesARunWhoseLeaseCannotBeRead(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("revisit-lease-unreadable", 50, nil)
	const runID = "r_mg_lease_err"
	config := func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour }
	charged := e.chargedHeld(e.reconciler("me", config), u, runID).ChargedMicro
	if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, 900, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	blind := e.reconciler("me", func(c *holds.ReconcilerConfig) { config(c); c.Leases = unreadableLeases{} })
	st, err := e.pass(blind)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.pauseRefunds(runID); st.PauseRefunds != 0 || len(g) != 0 {
		t.Fatalf("pass that could not read the run's lease: refunded %d runs, grants %v; want none until it can", st.PauseRefunds, g)
	}
	// The lease readable again (and absent), the next pass refunds.
	if _, err := e.pass(e.reconciler("me", config)); err != nil {
		t.Fatal(err)
	}
	if g := e.pauseRefunds(runID); len(g) != 1 || g[0] != charged-900 {
		t.Errorf("pass that read no lease: grants %v; want one of %d (%d charged, 900 used)", g, charged-900, charged)
	}
}

// TestReconcileRevisitRefundsNothingOnImpossibleFigures: a tally whose figures no call can have
// written (a negative cost or token count: a hand edit, a correction whose tally was lost) is no
// record of the call's usage (TallyBelievable), whatever the figures would give back: nothing is
// refunded on it. Taken at its word, a negative cost gave back more than the run was charged.
func TestReconcileRevisitRefundsNothingOnImpossibleFigures(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("revisit-impossible", 50, nil)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	cases := []struct {
		what, runID string
		fields      map[string]any // the tally's hash, written by hand
	}{
		{"a negative cost", "r_mg_neg_cost", map[string]any{"calls": 1, "in_tok": 100, "out_tok": 20, "cost_micro": -100_000}},
		{"a negative token count", "r_mg_neg_tok", map[string]any{"calls": 1, "in_tok": -100, "out_tok": 20, "cost_micro": 900}},
	}
	for _, c := range cases {
		e.chargedHeld(rec, u, c.runID)
		if err := e.rdb.HSet(e.ctx(), e.keys.Usage(c.runID), c.fields).Err(); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.Expire(e.ctx(), e.keys.Usage(c.runID), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.PauseRefunds != 0 {
		t.Errorf("pass refunded %d runs on impossible tallies; want none", st.PauseRefunds)
	}
	for _, c := range cases {
		if g := e.pauseRefunds(c.runID); len(g) != 0 {
			t.Errorf("%s: granted %v back; want none: the tally is no record of usage", c.what, g)
		}
	}
}

// refundFirst is the tally of a run whose own process, resumed, grants its pause refund (the
// same figures, so the same amount) just as a pass reads the tally: the pass's grant is then a
// replay of the process's.
type refundFirst struct {
	tallyUsage
	e      *storeEnv
	user   uint64
	amount int64
}

func (r refundFirst) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	if _, _, err := r.e.store.Grant(ctx, holds.GrantRequest{UserID: r.user, AmountMicro: r.amount,
		IdempotencyKey: holds.PauseRefundKey(runID), Reason: "refund: the process's own"}); err != nil {
		return holds.RunTally{}, false, err
	}
	return r.tallyUsage.Tallied(ctx, runID)
}

// TestReconcileRevisitCountsOnlyTheRefundsItGranted: a pass whose grant finds the run's process
// granted the same refund first (same key, same amount: a replay) gave nothing back itself;
// Stats.PauseRefunds, the operator's count of refunds the reconciler made, does not count it.
func TestReconcileRevisitCountsOnlyTheRefundsItGranted(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("revisit-count", 50, nil)
	const runID = "r_mg_replayed"
	config := func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour }
	run := e.chargedHeld(e.reconciler("me", config), u, runID)
	if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, 900, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := holds.PauseRefund(run, 900, false)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		config(c)
		c.Usage = refundFirst{tallyUsage: tallyUsage{e.tally}, e: e, user: u.ID, amount: want}
	})
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.pauseRefunds(runID); len(g) != 1 || g[0] != want {
		t.Fatalf("grants %v; want the process's one of %d", g, want)
	}
	if st.PauseRefunds != 0 {
		t.Errorf("pass whose grant replayed the process's refund counted %d refunds; want 0", st.PauseRefunds)
	}
}

// TestReconcileRevisitGoesOnPastARunItCannotRefundYet: the revisit reads a batch at a time
// after the last run it read, by (settled_at, run_id). A run it leaves (its tally written within
// RefundAfter, its process maybe about to set it right) stays listed, no grant keyed for it:
// read again from the same place, or from a bound that takes the last run read in again at a
// tie in settled_at, it headed every batch, the pass went round it until its time budget and
// every run behind it waited for as long as it stayed young. One pass refunds the run behind.
func TestReconcileRevisitGoesOnPastARunItCannotRefundYet(t *testing.T) {
	// The database's clock at noon: settled_at set back a minute stays on the day its ledger
	// row is, whenever the test runs.
	e := newStoreEnvMidday(t)
	u := e.user("revisit-past-young", 50, nil)
	const young, behind, settle = "r_mg_cur_a", "r_mg_cur_b", 30 * time.Second
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.RefundWindow, c.RefundAfter, c.Batch, c.PassBudget = time.Hour, settle, 1, 2*time.Second
	})
	charged := map[string]int64{}
	for _, id := range []string{young, behind} {
		charged[id] = e.chargedHeld(rec, u, id).ChargedMicro
		if err := e.tally.RecordCallWith(e.ctx(), id, 1, pricing.Usage{Input: 100, Output: 20}, 900, false, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	// One settled_at for both (charged in one statement), the young run first by run_id.
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = NOW(6) - INTERVAL 1 MINUTE WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	e.ageTally(behind, settle+time.Second)
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.pauseRefunds(behind); st.PauseRefunds != 1 || len(g) != 1 || g[0] != charged[behind]-900 {
		t.Errorf("pass behind a run with a young tally: refunded %d runs, grants %v for %s; want one of %d",
			st.PauseRefunds, g, behind, charged[behind]-900)
	}
	if g := e.pauseRefunds(young); len(g) != 0 {
		t.Errorf("%s, its tally young: grants %v; want none yet", young, g)
	}
}

// stalledLease is a lease checker whose Redis, once armed, holds the read of one run's lease
// until the read's deadline: that run's revisit then outlasts the pass's time budget.
type stalledLease struct {
	holds.LeaseChecker
	run   string
	armed *atomic.Bool
}

func (l stalledLease) Exists(ctx context.Context, runID string) (bool, error) {
	if l.armed.Load() && runID == l.run {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return l.LeaseChecker.Exists(ctx, runID)
}

// TestReconcileRevisitGoesOnAfterABatchThatSpentThePassBudget: a pass whose time budget ends
// with a full batch revisited (here one run, whose lease read stalled past the budget) leaves
// the next pass to go on after that run, not from the oldest again: a run the revisit cannot
// get past (a stalled read, each pass) would otherwise keep every run behind it unrefunded.
func TestReconcileRevisitGoesOnAfterABatchThatSpentThePassBudget(t *testing.T) {
	e := newStoreEnvMidday(t)
	u := e.user("revisit-budget-spent", 50, nil)
	const stalled, behind = "r_mg_bud_a", "r_mg_bud_b"
	var armed atomic.Bool
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.RefundWindow, c.Batch, c.PassBudget = time.Hour, 1, time.Second
		c.Leases = stalledLease{LeaseChecker: c.Leases, run: stalled, armed: &armed}
	})
	// Each run's revisit may last up to this, past the pass's budget of 1 s.
	rec.SetItemTimeout(2 * time.Second)
	charged := map[string]int64{}
	for _, id := range []string{stalled, behind} {
		charged[id] = e.chargedHeld(rec, u, id).ChargedMicro
	}
	// The tallies once both are charged: a pass that charged the second revisited the first.
	for _, id := range []string{stalled, behind} {
		if err := e.tally.RecordCallWith(e.ctx(), id, 1, pricing.Usage{Input: 100, Output: 20}, 900, false, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	// One settled_at for both, the stalled run first by run_id.
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = NOW(6) - INTERVAL 1 MINUTE WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	for pass := 1; pass <= 2; pass++ {
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	if g := e.pauseRefunds(behind); len(g) != 1 || g[0] != charged[behind]-900 {
		t.Errorf("two passes, the first's budget spent on %s's stalled lease read: grants %v for %s; want one of %d",
			stalled, g, behind, charged[behind]-900)
	}
	if g := e.pauseRefunds(stalled); len(g) != 0 {
		t.Errorf("%s, its lease unread: grants %v; want none", stalled, g)
	}
}
