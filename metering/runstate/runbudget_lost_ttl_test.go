package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRunLostMarkOfAReleaseLivesAsLongAsTheTally: a call that finds its reservation gone when
// it is tallied (Redis lost the run's keys while it ran) marks the run Lost, and the mark lives
// as long as the tally that lacks the calls before the loss, as AwaitRebuild's does: the run's
// later calls mark their records to come while it stands (ReleaseBeforeRecord), so that a
// settle between a call's tally and its record waits. Not only the longest call.
func TestRunLostMarkOfAReleaseLivesAsLongAsTheTally(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const tallyTTL, maxCall = 48 * time.Hour, time.Hour
	b := runstate.NewRunBudget(rdb, keys, tallyTTL, maxCall, testStaleAfter)
	ctx := context.Background()
	const run = "r_lost_ttl"
	if _, err := b.Reserve(ctx, run, "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, keys.RunBudget(run)).Err(); err != nil { // Redis lost the run's keys
		t.Fatal(err)
	}
	if marked, err := b.ReleaseBeforeRecord(ctx, run, "a", pricing.Usage{Output: 5}, 50, false); err != nil || !marked {
		t.Fatalf("release of a call whose reservation is gone: marked %v, %v; want the mark", marked, err)
	}
	if ttl := rdb.PTTL(ctx, keys.Lost(run)).Val(); ttl <= maxCall || ttl > tallyTTL {
		t.Fatalf("the run's loss mark lives %v, want the tally's %v", ttl, tallyTTL)
	}
}
