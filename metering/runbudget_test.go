package metering_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// runBudgetEnv is a run budget and the tally beside it, on the test Redis.
type runBudgetEnv struct {
	budget *metering.RunBudget
	tally  *metering.Tally
	keys   metering.Keys
	rdb    *redis.Client
}

func newRunBudget(t *testing.T) runBudgetEnv {
	rdb, prefix := testenv.Redis(t)
	keys := metering.Keys{Prefix: prefix}
	return runBudgetEnv{metering.NewRunBudget(rdb, keys, time.Hour, time.Minute), metering.NewTally(rdb, keys, time.Hour), keys, rdb}
}

// TestRunBudgetConcurrentCallsShareTheCap: 64 calls of one run reserve at once against a cap
// that fits ten of them. What is granted never adds up past the cap, and the tallied cost of
// the calls that ran (each spending all it was granted) stays within it.
func TestRunBudgetConcurrentCallsShareTheCap(t *testing.T) {
	e := newRunBudget(t)
	b, tally := e.budget, e.tally
	ctx := context.Background()
	const run, budget, want, least = "r_share", 10_000, 1_000, 100
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted []int64
	)
	start := make(chan struct{})
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			g, err := b.Reserve(ctx, run, budget, want, least)
			if errors.Is(err, metering.ErrRunBudget) {
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			granted = append(granted, g)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	var sum int64
	for _, g := range granted {
		if g < least || g > want {
			t.Fatalf("granted %d, want between %d and %d", g, least, want)
		}
		sum += g
	}
	if sum != budget || len(granted) != 10 {
		t.Fatalf("%d calls granted %d in all, want 10 calls granted the whole cap %d", len(granted), sum, budget)
	}
	for _, g := range granted {
		if err := b.Release(ctx, run, pricing.Usage{Output: 1}, g, g); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := tally.Get(ctx, run)
	if err != nil || got.CostMicro != budget || got.Calls != 10 {
		t.Fatalf("tally %+v, %v: want cost %d over 10 calls", got, err, budget)
	}
	if _, err := b.Reserve(ctx, run, budget, want, 0); !errors.Is(err, metering.ErrRunBudget) {
		t.Fatalf("reserve on a spent run: %v, want ErrRunBudget", err)
	}
}

// TestRunBudgetReleaseGivesBackWhatWasNotUsed: a call that spends less than it reserved
// leaves the rest to the run's next calls.
func TestRunBudgetReleaseGivesBackWhatWasNotUsed(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	g, err := b.Reserve(ctx, "r_rest", 10_000, 4_000, 100)
	if err != nil || g != 4_000 {
		t.Fatalf("first reserve: %d, %v", g, err)
	}
	if g, err := b.Reserve(ctx, "r_rest", 10_000, 10_000, 100); err != nil || g != 6_000 {
		t.Fatalf("reserve beside a call in flight: %d, %v; want the 6 000 it left", g, err)
	}
	if err := b.Release(ctx, "r_rest", pricing.Usage{Input: 10}, 300, 4_000); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, "r_rest", 10_000, 10_000, 100); err != nil || g != 3_700 {
		t.Fatalf("reserve after the first call spent 300: %d, %v; want 10 000 - 300 - 6 000", g, err)
	}
}

// TestRunCloseWaitsForCallsInFlight: a run cannot be closed for settlement while a call of it
// runs (its usage would be left out); once closed, no call of it starts.
func TestRunCloseWaitsForCallsInFlight(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	g, err := b.Reserve(ctx, "r_close", 10_000, 1_000, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CloseRun(ctx, "r_close"); !errors.Is(err, metering.ErrRunBusy) {
		t.Fatalf("close with a call in flight: %v, want ErrRunBusy", err)
	}
	if err := b.Release(ctx, "r_close", pricing.Usage{Output: 5}, 50, g); err != nil {
		t.Fatal(err)
	}
	if err := b.CloseRun(ctx, "r_close"); err != nil {
		t.Fatalf("close with no call in flight: %v", err)
	}
	if _, err := b.Reserve(ctx, "r_close", 10_000, 1_000, 100); !errors.Is(err, metering.ErrRunClosed) {
		t.Fatalf("reserve on a closed run: %v, want ErrRunClosed", err)
	}
	// A run that never had a call closes at once.
	if err := b.CloseRun(ctx, "r_never"); err != nil {
		t.Fatalf("close of a run without calls: %v", err)
	}
}

// TestRunBudgetExpiredUnderACallStaysWhole: a call that outlives the reservation's expiry
// still tallies, and its release does not bring the reservation back negative, which would
// hand the run's next calls budget it does not have.
func TestRunBudgetExpiredUnderACallStaysWhole(t *testing.T) {
	e := newRunBudget(t)
	b, tally, keys, rdb := e.budget, e.tally, e.keys, e.rdb
	ctx := context.Background()
	g, err := b.Reserve(ctx, "r_expire", 10_000, 4_000, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, keys.RunBudget("r_expire")).Err(); err != nil { // as if expired
		t.Fatal(err)
	}
	if err := b.Release(ctx, "r_expire", pricing.Usage{Output: 1}, 1_000, g); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, keys.RunBudget("r_expire")).Result(); err != nil || n != 0 {
		t.Fatalf("release recreated the expired reservation: exists=%d, %v", n, err)
	}
	if got, _, err := tally.Get(ctx, "r_expire"); err != nil || got.CostMicro != 1_000 {
		t.Fatalf("tally %+v, %v: want the call's 1 000", got, err)
	}
	if g, err := b.Reserve(ctx, "r_expire", 10_000, 10_000, 100); err != nil || g != 9_000 {
		t.Fatalf("reserve after: %d, %v; want 9 000", g, err)
	}
}
