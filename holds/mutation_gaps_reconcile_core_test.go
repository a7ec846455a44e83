package holds_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// Tests of the reconciler's scan and settlement (holds/reconcile.go, reconcile_dead.go) that no
// other test pins: each was written against a hand-made change of that code that every earlier
// test let pass (a mutation test).

// tallyRefusals is the reconciler's RefusalSource over the test's tally as the gateway wires it:
// marks that are no record are holds.ErrTallyCorrupt.
type tallyRefusals struct{ t *runstate.Tally }

func (r tallyRefusals) Refused(ctx context.Context, runID, token string) (bool, error) {
	ok, err := r.t.Refused(ctx, runID, token)
	if errors.Is(err, runstate.ErrTallyCorrupt) {
		err = fmt.Errorf("%w: %w", holds.ErrTallyCorrupt, err)
	}
	return ok, err
}

// TestReconcileChargesAHoldWhoseTallyOrMarksAreGarbage: a tally, or a run's marks of refused
// admissions, that Redis holds but that is no record (a key of the wrong type, written by hand)
// reads the same every pass. The hold is charged what it held, as one without a tally or a
// mark, in the first pass; taken for a failed read, it failed every pass for as long as the key
// lived and its credits stayed held.
func TestReconcileChargesAHoldWhoseTallyOrMarksAreGarbage(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("garbage-tally", 20, nil)
	const tallied, marked, token = "r_garbage_tally", "r_garbage_marks", "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"
	e.admit(u, tallied, holds.StateRunning)
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: marked, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour, Token: token}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{e.keys.Usage(tallied), e.keys.Refused(marked)} {
		if err := e.rdb.Set(e.ctx(), key, "garbage", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.expire(tallied)
	e.expire(marked)
	rec := e.reconciler("garbage", func(c *holds.ReconcilerConfig) { c.Refusals = tallyRefusals{e.tally} })
	st, err := e.pass(rec)
	if err != nil || st.ChargedHeld != 2 || st.Errors != 0 {
		t.Fatalf("pass: %+v, %v; want both holds charged what they held (2 charged_held, no error)", st, err)
	}
	for _, runID := range []string{tallied, marked} {
		r := e.run(u, runID)
		if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != r.HeldMicro {
			t.Errorf("%s: %s by %q charged %d of %d held; want settled by %s at its hold", runID, r.State,
				r.SettleSource.String, r.ChargedMicro, r.HeldMicro, holds.SourceReconcileHold)
		}
	}
}

// TestReconcileSettlesAQueuedHoldWithATallyFromTheTally: a hold whose row still says queued
// but whose run has a tally (its process forwarded the call and died before the state change
// landed) is settled from the tally, as DESIGN §5 settles any run with one: the tally comes
// before the state. Released at 0 as a hold never forwarded, the call went unpaid.
func TestReconcileSettlesAQueuedHoldWithATallyFromTheTally(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("queued-tallied", 20, nil)
	const runID = "r_queued_tallied"
	e.admit(u, runID, holds.StateQueued)
	e.addTally(runID, pricing.Usage{Input: 900, Output: 100}, 3250)
	e.expire(runID)
	st, err := e.pass(e.reconciler("queued-tallied", nil))
	if err != nil || st.FromTally != 1 || st.Released != 0 || st.ChargedMicro != 3250 {
		t.Fatalf("pass: %+v, %v; want the queued hold settled from its tally (1 from_tally, 3250 charged)", st, err)
	}
	if r := e.run(u, runID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 3250 {
		t.Fatalf("%s: %s by %q charged %d; want settled by %s at its tally's 3250", runID, r.State, r.SettleSource.String,
			r.ChargedMicro, holds.SourceReconcile)
	}
}

// TestReconcileFromTheTallyKeepsItsEstimatedMark: a one-call run whose call was charged the
// gateway's estimate (no usage report) carries the mark in its tally alone; settled from that
// tally, its row is marked estimated, as the call's own settlement would have marked it.
func TestReconcileFromTheTallyKeepsItsEstimatedMark(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("tally-estimated", 20, nil)
	const estimated, reported = "r_tally_estimated", "r_tally_reported"
	for _, runID := range []string{estimated, reported} {
		e.admit(u, runID, holds.StateRunning)
		if err := e.tally.Add(e.ctx(), runID, pricing.Usage{Input: 900, Output: 100}, 3250, runID == estimated); err != nil {
			t.Fatal(err)
		}
		e.expire(runID)
	}
	if st, err := e.pass(e.reconciler("tally-estimated", nil)); err != nil || st.FromTally != 2 {
		t.Fatalf("pass: %+v, %v; want both runs settled from their tallies", st, err)
	}
	for _, runID := range []string{estimated, reported} {
		r := e.run(u, runID)
		if r.SettleSource.String != holds.SourceReconcile || r.Estimated != (runID == estimated) {
			t.Errorf("%s: settled by %q, estimated %v; want settled by %s, estimated %v as its tally says", runID,
				r.SettleSource.String, r.Estimated, holds.SourceReconcile, runID == estimated)
		}
	}
}

// TestReconcileTallyOfTheMostCallsTheColumnHoldsIsBelieved: a tally's call count is believable
// up to the largest the row's calls column records (2³¹-1) included; the run is settled from
// it, not charged what it held as one whose tally is impossible.
func TestReconcileTallyOfTheMostCallsTheColumnHoldsIsBelieved(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("tally-max-calls", 20, nil)
	const runID = "r_tally_max_calls"
	e.admit(u, runID, holds.StateRunning)
	e.addTally(runID, pricing.Usage{Input: 900, Output: 100}, 3250)
	if err := e.rdb.HSet(e.ctx(), e.keys.Usage(runID), "calls", math.MaxInt32).Err(); err != nil {
		t.Fatal(err)
	}
	e.expire(runID)
	if st, err := e.pass(e.reconciler("tally-max-calls", nil)); err != nil || st.FromTally != 1 || st.ChargedHeld != 0 {
		t.Fatalf("pass: %+v, %v; want the run settled from its tally of %d calls", st, err, math.MaxInt32)
	}
	if r := e.run(u, runID); r.SettleSource.String != holds.SourceReconcile || r.Calls != math.MaxInt32 || r.ChargedMicro != 3250 {
		t.Fatalf("%s: settled by %q, %d calls, charged %d; want settled by %s, %d calls, 3250 charged", runID,
			r.SettleSource.String, r.Calls, r.ChargedMicro, holds.SourceReconcile, math.MaxInt32)
	}
}

// TestReconcilePassStoppedByItsBudgetGoesOnAfterAFailingHold: a pass that stops at its time
// budget leaves the next pass its cursor, as one stopped at its batch limit does: the oldest
// expired hold fails every pass (its tally unreadable) and a pass's budget lets it handle one
// hold, yet the hold behind it settles at the next pass. Started again from the oldest, every
// pass spent its budget on the failing hold and the one behind it never settled.
func TestReconcilePassStoppedByItsBudgetGoesOnAfterAFailingHold(t *testing.T) {
	e := newStoreEnv(t)
	stuck := e.user("budget-stuck", 10, nil)
	other := e.user("budget-other", 10, nil)
	e.expiredFirst(e.admit(stuck, "r_budget_stuck", holds.StateRunning).RunID)
	behind := e.expiredWithTallies(other, 2)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.PassBudget = time.Nanosecond // the first hold of a pass only
		c.Usage = unreadableFor{tallyUsage{e.tally}, map[string]bool{"r_budget_stuck": true}}
	})
	if st, err := e.pass(rec); err == nil || st.Scanned != 1 || st.Errors != 1 || st.StoppedAt != holds.StopTimeBudget {
		t.Fatalf("first pass: %+v, %v; want the failing hold tried, the pass stopped at its time budget", st, err)
	}
	for pass := 2; pass <= 3; pass++ {
		if st, err := e.pass(rec); err != nil || st.Scanned != 1 || st.FromTally != 1 {
			t.Fatalf("pass %d: %+v, %v; want the next hold behind the failing one settled from its tally", pass, st, err)
		}
	}
	for _, id := range behind {
		if r := e.run(other, id); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
			t.Errorf("hold %s behind the failing one after three passes: %s, charged %d; want settled at 1000", id, r.State, r.ChargedMicro)
		}
	}
}

// TestReconcileScanLeavesAHoldJustShortOfItsExpiry: the scan reads the holds whose expiry has
// passed by the database clock, not those about to: with the clock standing still, a hold due
// to expire half a second on is not read by any pass. (The settlement's own re-check under the
// row lock would refuse it, but the pass counted it, and a leased one had its expiry moved.)
func TestReconcileScanLeavesAHoldJustShortOfItsExpiry(t *testing.T) {
	e := newStoreEnvMidday(t)
	u := e.user("short-of-expiry", 10, nil)
	const runID = "r_short_of_expiry"
	e.admit(u, runID, holds.StateRunning)
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) + INTERVAL 500000 MICROSECOND WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	before := e.run(u, runID).ExpiresAt
	if st, err := e.pass(e.reconciler("me", nil)); err != nil || st.Scanned != 0 {
		t.Fatalf("pass: %+v, %v; want nothing read, the hold's expiry half a second ahead of the database clock", st, err)
	}
	if r := e.run(u, runID); r.State != holds.StateRunning || !r.ExpiresAt.Equal(before) {
		t.Fatalf("%s: %s expiring %v, want untouched (running, %v)", runID, r.State, r.ExpiresAt, before)
	}
}
