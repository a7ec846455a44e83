package runstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRunAwaitRebuildWaitsStaleAfterFromTheFirstNotice: a run whose Redis record lost calls
// may settle only once staleAfter has passed since the loss was first noticed: until then a
// call in flight has had no heartbeat to write its lease again. Every check within that time
// is busy, not only the first (a settle retried at once must not find the run free), and one
// after it is not.
func TestRunAwaitRebuildWaitsStaleAfterFromTheFirstNotice(t *testing.T) {
	e := newRunBudget(t) // staleAfter: a minute
	ctx := context.Background()
	const run = "r_rebuild"
	for i := range 3 {
		if err := e.budget.AwaitRebuild(ctx, run); !errors.Is(err, runstate.ErrRunBusy) {
			t.Fatalf("check %d within staleAfter of the loss: %v, want ErrRunBusy", i+1, err)
		}
	}
	if tl := e.rdb.PTTL(ctx, e.keys.Lost(run)).Val(); tl <= 0 {
		t.Fatalf("loss mark lives %v, want the tally's life", tl)
	}
	// The loss noticed a minute and a second ago, by Redis's clock.
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	at := now.Add(-testStaleAfter - time.Second).UnixMilli()
	if err := e.rdb.Set(ctx, e.keys.Lost(run), at, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.budget.AwaitRebuild(ctx, run); err != nil {
		t.Fatalf("check staleAfter past the loss: %v, want the run free", err)
	}
}
