package runstate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRunBudgetHashLivesAsLongAsACall: the budget hash of a run must expire by itself, and not
// before its fields are due. A reservation gives it a call's life (maxCall, an hour here): a
// call that ends within one heartbeat is never beaten, and without it the hash of a process
// killed mid-call stayed in Redis for good. A call's record mark (ReleaseBeforeRecord on a run
// whose record lost calls) keeps the run from settling until its record lands; written into a
// hash about to lapse, or one that had lapsed, it vanished with it (a settlement then no longer
// waited for the record) or lived for good.
func TestRunBudgetHashLivesAsLongAsACall(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "r_ttl", "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	if tl := e.rdb.PTTL(ctx, e.keys.RunBudget("r_ttl")).Val(); tl <= 0 || tl > time.Hour {
		t.Fatalf("budget hash after a reservation lives %v, want up to the hour a call may run", tl)
	}
	if err := b.Release(ctx, "r_ttl", "a", pricing.Usage{}, 0, false); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		run  string
		left time.Duration // the hash's life when the mark is written; 0: no hash
	}{{"r_ttl_none", 0}, {"r_ttl_short", 10 * time.Second}} {
		if err := e.rdb.Set(ctx, e.keys.Lost(c.run), 0, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if c.left > 0 {
			hash := e.keys.RunBudget(c.run)
			if err := e.rdb.HSet(ctx, hash, "c:other", "1:1").Err(); err != nil {
				t.Fatal(err)
			}
			if err := e.rdb.PExpire(ctx, hash, c.left).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if marked, err := b.ReleaseBeforeRecord(ctx, c.run, "a", pricing.Usage{Output: 5}, 50, false); err != nil || !marked {
			t.Fatalf("%s: release before record: marked %v, %v; want the mark", c.run, marked, err)
		}
		if tl := e.rdb.PTTL(ctx, e.keys.RunBudget(c.run)).Val(); tl < 30*time.Minute || tl > time.Hour {
			t.Fatalf("%s: budget hash holding a record mark lives %v, want about the hour a call may run", c.run, tl)
		}
	}
}

// TestRunBudgetRefusalAfterALostTallyLeavesNoKeyForGood: a reservation refused for the run's
// budget (402) that finds the run's tally short of its row's record (a Redis restart without
// persistence lost it, and the budget hash with it) writes the hash's lost field. Written into
// no hash, that field made one without a TTL: the run's key stayed in Redis for good.
func TestRunBudgetRefusalAfterALostTallyLeavesNoKeyForGood(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run = "r_ttl_refused"
	if _, err := e.budget.ReserveAtMost(ctx, run, "a", 10_000, 1_000, 100, 4, 10_000); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve on a run whose row records its whole cap: %v, want ErrRunBudget", err)
	}
	hash := e.keys.RunBudget(run)
	if n := e.rdb.Exists(ctx, hash).Val(); n == 0 {
		return // nothing written: nothing to expire
	}
	if tl := e.rdb.PTTL(ctx, hash).Val(); tl <= 0 || tl > time.Hour {
		t.Fatalf("budget hash written by a refused reservation lives %v, want at most the hour a call may run", tl)
	}
}
