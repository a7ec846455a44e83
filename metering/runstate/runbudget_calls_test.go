package runstate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRunBudgetBoundsItsCallsInFlight: a run may have maxCalls calls in flight and no more (the
// hold's max_in_flight: one slot of the user's for all of them); the call past the bound is
// refused with ErrRunCalls and reserves nothing, and one ending makes room for the next.
func TestRunBudgetBoundsItsCallsInFlight(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	const run, maxCalls = "r_bound", 2
	for _, call := range []string{"a", "b"} {
		if g, err := b.ReserveAtMost(ctx, run, call, 10_000, 1_000, 100, maxCalls, 0); err != nil || g != 1_000 {
			t.Fatalf("reserve %s within the bound: %d, %v", call, g, err)
		}
	}
	if _, err := b.ReserveAtMost(ctx, run, "c", 10_000, 1_000, 100, maxCalls, 0); !errors.Is(err, runstate.ErrRunCalls) {
		t.Fatalf("reserve of a third call with %d in flight: %v, want ErrRunCalls", maxCalls, err)
	}
	if n := e.rdb.HExists(ctx, e.keys.RunBudget(run), "c:c").Val(); n {
		t.Fatal("the refused call left a reservation")
	}
	if n := b.Held(); n != maxCalls {
		t.Fatalf("%d reservations beaten after the refusal, want the %d in flight", n, maxCalls)
	}
	if err := b.Release(ctx, run, "a", pricing.Usage{Output: 1}, 100, false); err != nil {
		t.Fatal(err)
	}
	if g, err := b.ReserveAtMost(ctx, run, "c", 10_000, 1_000, 100, maxCalls, 0); err != nil || g != 1_000 {
		t.Fatalf("reserve once a call ended: %d, %v", g, err)
	}
}
