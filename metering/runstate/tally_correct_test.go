package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyCorrectionWithoutItsTallyWritesNothing: Correct adds what a call's settlement found
// beyond the tally written before its answer's end. If Redis lost that write (a restart, a
// failover to a replica it had not reached), the correction alone is no record of what the
// run used: written, it made a tally of the difference (negative when a later usage report
// was smaller), and a reconciler finding it settled the run at that difference, instead of
// charging what it held as DESIGN §5 says of a run whose usage is lost.
func TestTallyCorrectionWithoutItsTallyWritesNothing(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	tl := runstate.NewTally(e.rdb, e.keys, time.Hour)
	for _, c := range []struct {
		run string
		du  pricing.Usage
		dc  int64
	}{
		{"r_correct_up", pricing.Usage{Output: 40}, 1_200},
		{"r_correct_down", pricing.Usage{Output: -40}, -1_200},
	} {
		if err := tl.Correct(ctx, c.run, c.du, c.dc, 0); err != nil {
			t.Fatal(err)
		}
		if got, found, err := tl.Get(ctx, c.run); err != nil || found {
			t.Errorf("%s: correction of a tally Redis lost left %+v found=%v err=%v; want no tally", c.run, got, found, err)
		}
	}
	// With its tally there, the correction applies.
	if err := tl.Add(ctx, "r_correct_kept", pricing.Usage{Input: 10, Output: 100}, 5_000, false); err != nil {
		t.Fatal(err)
	}
	if err := tl.Correct(ctx, "r_correct_kept", pricing.Usage{Output: -40}, -1_200, 0); err != nil {
		t.Fatal(err)
	}
	got, found, err := tl.Get(ctx, "r_correct_kept")
	if err != nil || !found || got.CostMicro != 3_800 || got.Usage.Output != 60 || got.Usage.Input != 10 || got.Calls != 1 {
		t.Fatalf("corrected tally %+v found=%v err=%v; want cost 3800, out 60, in 10, one call", got, found, err)
	}
	if ttl := e.rdb.PTTL(ctx, e.keys.Usage("r_correct_kept")).Val(); ttl <= 0 {
		t.Fatalf("corrected tally's TTL %v, want one", ttl)
	}
}
