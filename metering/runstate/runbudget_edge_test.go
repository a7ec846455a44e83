package runstate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRunBudgetGrantsTheLeastThatIsExactlyLeft: a call whose least (its cost without any
// output) is exactly what the run has left fits its cap, and is granted that; a call whose
// least is one micro-USD more does not.
func TestRunBudgetGrantsTheLeastThatIsExactlyLeft(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	if g, err := b.ReserveAtMost(ctx, "r_edge", "a", 10_000, 5_000, 100, 0, 9_900); err != nil || g != 100 {
		t.Fatalf("reserve with 100 left and least 100: %d, %v; want the 100 left", g, err)
	}
	if _, err := b.ReserveAtMost(ctx, "r_edge2", "a", 10_000, 5_000, 101, 0, 9_900); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve with 100 left and least 101: %v, want ErrRunBudget", err)
	}
}
