package runstate_test

import (
	"context"
	"testing"
	"time"

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
