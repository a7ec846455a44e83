package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// TestTallyCorrectionMovesItsPrices: a correction whose settlement bills the call at other
// prices than its tally was written with replaces them (CorrectPrices), or drops them when the
// hold's own now explain the cost; Correct leaves them; neither writes to a tally Redis lost.
func TestTallyCorrectionMovesItsPrices(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	tl := runstate.NewTally(e.rdb, e.keys, time.Hour)
	written := func(run string, prices []byte) {
		t.Helper()
		var with func(redis.Pipeliner)
		if prices != nil {
			with = func(p redis.Pipeliner) { tl.QueueSnapshot(ctx, p, run, prices) }
		}
		if err := tl.AddWith(ctx, run, pricing.Usage{Input: 10}, 100, true, with); err != nil {
			t.Fatal(err)
		}
	}
	written("r_prices_kept", []byte(`{"a":1}`))
	written("r_prices_set", nil)
	written("r_prices_del", []byte(`{"a":1}`))
	if err := tl.Correct(ctx, "r_prices_kept", pricing.Usage{Output: 5}, 50, -1); err != nil {
		t.Fatal(err)
	}
	if err := tl.CorrectPrices(ctx, "r_prices_set", pricing.Usage{Output: 5}, 50, -1, []byte(`{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	if err := tl.CorrectPrices(ctx, "r_prices_del", pricing.Usage{Output: 5}, 50, -1, nil); err != nil {
		t.Fatal(err)
	}
	if err := tl.CorrectPrices(ctx, "r_prices_lost", pricing.Usage{Output: 5}, 50, -1, []byte(`{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	for run, want := range map[string]string{"r_prices_kept": `{"a":1}`, "r_prices_set": `{"b":2}`, "r_prices_del": ""} {
		got, found, err := tl.Get(ctx, run)
		if err != nil || !found || got.PriceSnapshot != want || got.CostMicro != 150 || got.Usage.Output != 5 || got.EstimatedCalls != 0 {
			t.Errorf("%s: %+v found=%v err=%v; want prices %q, cost 150, out 5, no estimate", run, got, found, err, want)
		}
	}
	if n := e.rdb.Exists(ctx, e.keys.Usage("r_prices_lost")).Val(); n != 0 {
		t.Errorf("a correction of a tally Redis lost wrote one")
	}
}
