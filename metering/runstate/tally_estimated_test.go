package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyCountsEstimatedCalls: a run the reconciler settles from its tally is marked
// estimated when one of its calls was charged an estimate, as the call's own settlement would
// have marked it. The mark is counted by every writer of a tally: a call's (Add), a one-call
// run's (RecordCallWith, whose later write replaces it) and a named run's (Release).
func TestTallyCountsEstimatedCalls(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	tl := runstate.NewTally(e.rdb, e.keys, time.Hour)
	u := pricing.Usage{Input: 100, Output: 10}
	estimated := func(run string) int64 {
		t.Helper()
		got, found, err := tl.Get(ctx, run)
		if err != nil || !found {
			t.Fatalf("tally of %s: found=%v err=%v", run, found, err)
		}
		return got.EstimatedCalls
	}

	if err := tl.Add(ctx, "r_est_add", u, 1_000, true); err != nil {
		t.Fatal(err)
	}
	if n := estimated("r_est_add"); n != 1 {
		t.Fatalf("an estimated call's tally counts %d estimated calls, want 1", n)
	}
	if err := tl.Add(ctx, "r_est_add", u, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if n := estimated("r_est_add"); n != 1 {
		t.Fatalf("after a reported call too: %d estimated calls, want 1", n)
	}
	if err := tl.RecordCallWith(ctx, "r_est_recorded", 1, u, 1_000, true, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := estimated("r_est_recorded"); n != 1 {
		t.Fatalf("a one-call run's estimated call counts %d estimated calls, want 1", n)
	}
	if err := tl.RecordCallWith(ctx, "r_est_recorded", 2, u, 1_000, false, nil, nil); err != nil { // its usage came after all
		t.Fatal(err)
	}
	if n := estimated("r_est_recorded"); n != 0 {
		t.Fatalf("after the estimate was replaced by a report: %d estimated calls, want 0", n)
	}

	if _, err := e.budget.Reserve(ctx, "r_est_named", "a", 100_000, 10_000, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, "r_est_named", "a", u, 1_000, true); err != nil {
		t.Fatal(err)
	}
	if n := estimated("r_est_named"); n != 1 {
		t.Fatalf("a named run's estimated call counts %d estimated calls, want 1", n)
	}
}

// TestReleaseCountsAFreeCall: a named run's call on a model priced at 0 costs nothing but used
// tokens: it is a call of the run in its tally, not one that used nothing.
func TestReleaseCountsAFreeCall(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	tl := runstate.NewTally(e.rdb, e.keys, time.Hour)
	u := pricing.Usage{Input: 100, Output: 10}
	if _, err := e.budget.Reserve(ctx, "r_free_named", "a", 100_000, 10_000, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, "r_free_named", "a", u, 0, false); err != nil {
		t.Fatal(err)
	}
	got, found, err := tl.Get(ctx, "r_free_named")
	if err != nil || !found || got.Calls != 1 || got.Usage != u || got.CostMicro != 0 {
		t.Fatalf("free call's tally %+v found=%v err=%v; want one call, usage %+v, cost 0", got, found, err, u)
	}
}

// TestReleaseOfACallThatUsedNothingMarksNoEstimate: a named run's call that used nothing is no
// call of the run (its tally is evidence only, see Tally.MarkUnused), so neither is it an
// estimated one, whatever its caller says: an estimated mark without its call marked the run's
// settlement from the tally as charged an estimate.
func TestReleaseOfACallThatUsedNothingMarksNoEstimate(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	if _, err := e.budget.Reserve(ctx, "r_nothing_est", "a", 100_000, 10_000, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.Release(ctx, "r_nothing_est", "a", pricing.Usage{}, 0, true); err != nil {
		t.Fatal(err)
	}
	got, found, err := e.tally.Get(ctx, "r_nothing_est")
	if err != nil || !found || got != (runstate.Tallied{Ended: 1, EndedKnown: true}) {
		t.Fatalf("tally of a call that used nothing: %+v found=%v err=%v; want found, all zero but its one ended call", got, found, err)
	}
}
