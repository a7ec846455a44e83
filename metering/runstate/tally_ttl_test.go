package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestTallyLapsesAfterItsTTL: every call's tally write gives the run's hash the tally TTL (long
// past any hold's expiry), so it lapses once no reconciler can need it: without it a tally
// stayed for good, one hash per run, until a Redis that refuses writes when full (the
// configuration the gateway asks for) refused every call's.
func TestTallyLapsesAfterItsTTL(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const ttl = time.Hour
	tally := runstate.NewTally(rdb, keys, ttl)
	ctx := context.Background()
	const run = "r_tally_lapses"
	if err := tally.Add(ctx, run, pricing.Usage{Input: 10, Output: 5}, 70, false); err != nil {
		t.Fatal(err)
	}
	if got := rdb.PTTL(ctx, keys.Usage(run)).Val(); got <= 0 || got > ttl {
		t.Fatalf("the tally lives %v; want it to lapse within the tally TTL (%v)", got, ttl)
	}
}
