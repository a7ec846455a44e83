package runstate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
)

// TestRunCloseDropsARecordMarkAfterStaleAfter: a call's mark of a record to come (r:, left by
// ReleaseBeforeRecord) whose process never said Recorded (killed between its two writes) keeps
// the run's settlement busy for staleAfter, the lease TTL, and no longer: not for maxCall, the
// longest a call may run (an hour here), which kept a dead process's run unsettleable as long.
func TestRunCloseDropsARecordMarkAfterStaleAfter(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run = "r_rec_stale"
	// mark sets the record mark of call dead to ago before Redis's clock.
	mark := func(ago time.Duration) {
		t.Helper()
		now, err := e.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.HSet(ctx, e.keys.RunBudget(run), "r:dead", fmt.Sprint(now.Add(-ago).UnixMilli())).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mark(testStaleAfter - 5*time.Second)
	if _, err := e.budget.CloseRun(ctx, run); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close with a record mark made %v ago: %v, want ErrRunBusy", testStaleAfter-5*time.Second, err)
	}
	mark(testStaleAfter + 5*time.Second) // well within maxCall
	if _, err := e.budget.CloseRun(ctx, run); err != nil {
		t.Fatalf("close with a record mark made %v ago, past staleAfter: %v", testStaleAfter+5*time.Second, err)
	}
}
