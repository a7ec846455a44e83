package main

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallySourceCarriesTheTally: the reconciler settles an expired run from what tallySource
// reads, so every figure must reach it: cost, calls, and whether a call was charged an estimate
// (the run's estimated flag in reports). Mutant: Estimated always false (survived the e2e
// reconcile test too, whose tallies are measured), and the prices a call answered by another
// model than asked was billed at (the proxy's tests read the tally through an adapter of their
// own: dropped here, the reconciler recorded the hold's prices, not those of its cost).
func TestTallySourceCarriesTheTally(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	tally := runstate.NewTally(rdb, runstate.Keys{Prefix: prefix}, time.Hour)
	src := tallySource{tally}
	if err := tally.Add(ctx, "r_measured", pricing.Usage{Input: 10, Output: 5}, 700, false); err != nil {
		t.Fatal(err)
	}
	billed := []byte(`{"model":"dearer","input":2}`)
	if err := tally.RecordCallWith(ctx, "r_answered", 1, pricing.Usage{Input: 10}, 20, false, billed, nil); err != nil {
		t.Fatal(err)
	}
	if err := tally.Add(ctx, "r_estimated", pricing.Usage{Input: 10}, 300, false); err != nil {
		t.Fatal(err)
	}
	if err := tally.Add(ctx, "r_estimated", pricing.Usage{Input: 20}, 400, true); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		run       string
		cost      int64
		calls     int64
		estimated bool
		snapshot  string
	}{{"r_measured", 700, 1, false, ""}, {"r_estimated", 700, 2, true, ""}, {"r_answered", 20, 1, false, string(billed)}} {
		got, found, err := src.Tallied(ctx, tc.run)
		if err != nil || !found || got.CostMicro != tc.cost || got.Calls != tc.calls || got.Estimated != tc.estimated ||
			string(got.PriceSnapshot) != tc.snapshot {
			t.Errorf("%s: %+v found %v err %v; want cost %d, %d calls, estimated %v, snapshot %q", tc.run, got, found, err,
				tc.cost, tc.calls, tc.estimated, tc.snapshot)
		}
	}
	// Its age too: dropped, every tally was one just written, and the revisit of a run charged
	// its hold (which waits for one that stands still, holds.ReconcilerConfig.RefundAfter)
	// refunded none.
	if err := rdb.PExpire(ctx, runstate.Keys{Prefix: prefix}.Usage("r_measured"), 30*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _, err := src.Tallied(ctx, "r_measured"); err != nil || got.Age < 30*time.Minute {
		t.Errorf("a tally with 30m of its hour left: aged %v, %v; want 30m or more", got.Age, err)
	}
	// And the source of a call's zero tally: the revisit's refund says by it that the call
	// answered nothing (an Idempotency-Key's retry reads that once Redis lost the key's record).
	if err := tally.MarkCallUnused(ctx, "r_refused", "upstream_error"); err != nil {
		t.Fatal(err)
	}
	if got, found, err := src.Tallied(ctx, "r_refused"); err != nil || !found || got.Source != "upstream_error" {
		t.Errorf("a call refused by its upstream: %+v found %v err %v; want source upstream_error", got, found, err)
	}
	if _, found, err := src.Tallied(ctx, "r_none"); err != nil || found {
		t.Errorf("no tally: found %v, %v", found, err)
	}
}
