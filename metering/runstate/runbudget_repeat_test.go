package runstate_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestRunBudgetRepeatedReserveReturnsItsGrant: a Reserve that go-redis resends after losing
// its reply finds the call's own reservation and returns it as it is. Reserving afresh instead
// counts the first reservation against the second: a call that took the whole budget is
// refused by its own repeat (ErrRunBudget while its reservation stands), and one that took more
// than half is granted less than it holds.
func TestRunBudgetRepeatedReserveReturnsItsGrant(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	for i := range 2 {
		if g, err := b.Reserve(ctx, "r_again_all", "a", 10_000, 10_000, 100); err != nil || g != 10_000 {
			t.Fatalf("reserve %d of the whole budget by call a: %d, %v; want 10 000 both times", i+1, g, err)
		}
	}
	for i := range 2 {
		if g, err := b.Reserve(ctx, "r_again_most", "a", 10_000, 7_000, 100); err != nil || g != 7_000 {
			t.Fatalf("reserve %d of 7 000 of 10 000 by call a: %d, %v; want 7 000 both times", i+1, g, err)
		}
	}
}

// TestRunBudgetReservationLandingAfterItsReleaseReservesNothing: a Reserve that timed out
// on its caller may still run in Redis after the call's Release (the caller releases whatever
// its reserve returned; go-redis resent it and the resend landed first). It finds the call
// released (its done mark), reserves nothing and says so: the run's next calls get the whole
// budget back at once, and its settle finds nothing in flight. Reserved, no process stamped
// it, and only a repeated Release (the tally retried after a lost reply) dropped it before
// staleAfter. A repeated Release still tallies nothing.
func TestRunBudgetReservationLandingAfterItsReleaseReservesNothing(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	const run = "r_late_reserve"
	if err := b.Release(ctx, run, "a", pricing.Usage{Output: 10}, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, run, "a", 10_000, 4_000, 100); err == nil || g != 0 { // the late one
		t.Fatalf("late reserve of a released call: %d, %v; want nothing and an error", g, err)
	}
	if g, err := b.Reserve(ctx, run, "b", 10_000, 10_000, 100); err != nil || g != 9_000 {
		t.Fatalf("reserve of call b: %d, %v; want the 9 000 call a's cost leaves", g, err)
	}
	if err := b.Release(ctx, run, "a", pricing.Usage{Output: 10}, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if got, _, err := e.tally.Get(ctx, run); err != nil || got.Calls != 1 || got.CostMicro != 1_000 {
		t.Fatalf("tally %+v, %v: want call a once", got, err)
	}
}
