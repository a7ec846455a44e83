package runstate_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRunBudgetReopenMarkLapsesAfterTheLongestCall: a failed settlement's reopen leaves its
// mark (o:<mark>) in the run's budget hash, so that its close delivered late closes nothing.
// A close is not late by more than the longest call (the mark of a close that landed lives no
// longer), so neither need the reopen's record be: it must go once that has passed, while the
// run's calls go on. It stayed as long as the hash, which every call of the run keeps alive:
// one field more for each failed settle of a run that goes on calling (a client retrying its
// settle through a database outage), read by every reservation and close of the run.
func TestRunBudgetReopenMarkLapsesAfterTheLongestCall(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const maxCall = time.Second
	b := runstate.NewRunBudget(rdb, keys, time.Hour, maxCall, testStaleAfter)
	ctx := context.Background()
	const run = "r_reopen_lapses"
	hash := keys.RunBudget(run)
	m1 := mustClose(t, b, run)
	if err := b.ReopenRun(ctx, run, m1); err != nil {
		t.Fatal(err)
	}
	reopened := rdb.Time(ctx).Val()
	// A call of the run goes on past the longest call's time since the reopen, beaten.
	if _, err := b.Reserve(ctx, run, "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * maxCall)
	for rdb.Time(ctx).Val().Sub(reopened) <= maxCall+10*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("Redis's clock did not pass the longest call since the reopen")
		}
		if _, err := b.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if rdb.Exists(ctx, hash).Val() == 0 {
			t.Fatal("the run's budget hash lapsed while its call was beaten: nothing tested")
		}
		time.Sleep(20 * time.Millisecond) // the beat's pace, not a wait for an outcome
	}
	if err := b.Release(ctx, run, "a", pricing.Usage{Output: 5}, 50, false); err != nil {
		t.Fatal(err)
	}
	m2 := mustClose(t, b, run)
	if err := b.ReopenRun(ctx, run, m2); err != nil {
		t.Fatal(err)
	}
	if rdb.HExists(ctx, hash, "o:"+m1).Val() {
		t.Fatalf("the reopen's mark outlives the longest call (%v) in a hash the run's calls keep: one field more per failed settle", maxCall)
	}
	if !rdb.HExists(ctx, hash, "o:"+m2).Val() {
		t.Fatal("the last reopen's mark is gone: its close, delivered late, would close the run")
	}
}

// TestRunBudgetReopenMarkOutlivesTheRunsReservations: the reopen's mark (o:<mark>) must stand
// until the longest call has passed, through the reservations of the run's calls that come
// meanwhile (each drops the marks it finds older than that): the caller's next call after a
// failed settle reserves before the settle's close, delivered late, lands. It is measured
// against the longest call, not the run's stale window, which is shorter: dropped sooner, the
// late close found no mark and closed the run, its calls refused as settled with no one left to
// reopen it.
func TestRunBudgetReopenMarkOutlivesTheRunsReservations(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const staleAfter = 200 * time.Millisecond
	b := runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, staleAfter)
	ctx := context.Background()
	const run = "r_reopen_outlives"
	hash := keys.RunBudget(run)
	m := mustClose(t, b, run)
	if err := b.ReopenRun(ctx, run, m); err != nil {
		t.Fatal(err)
	}
	reopened := rdb.Time(ctx).Val()
	reserve := func(call string) {
		t.Helper()
		if _, err := b.Reserve(ctx, run, call, 10_000, 1_000, 100); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, run, call, pricing.Usage{Output: 5}, 50, false); err != nil {
			t.Fatal(err)
		}
		if !rdb.HExists(ctx, hash, "o:"+m).Val() {
			t.Fatalf("call %s's reservation dropped the reopen's mark %v after it, within the longest call (1h)",
				call, rdb.Time(ctx).Val().Sub(reopened))
		}
	}
	reserve("a") // at once
	deadline := time.Now().Add(10 * staleAfter)
	for rdb.Time(ctx).Val().Sub(reopened) <= staleAfter+10*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("Redis's clock did not pass the stale window since the reopen")
		}
		time.Sleep(10 * time.Millisecond) // Redis's clock's pace, not a wait for an outcome
	}
	reserve("b") // past the stale window, well within the longest call
}

// TestRunBudgetReopenOfARunNeverClosedLapses: a reopen whose close never landed finds no
// budget hash (a run with no call in flight) and writes its mark into a new one. That hash
// must lapse with the longest call, as a close's does: without its expiry it stayed for good, one
// key per failed settle of a run nobody calls again.
func TestRunBudgetReopenOfARunNeverClosedLapses(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	const maxCall = time.Minute
	b := runstate.NewRunBudget(rdb, keys, time.Hour, maxCall, testStaleAfter)
	ctx := context.Background()
	const run = "r_reopen_never_closed"
	if err := b.ReopenRun(ctx, run, "mark-of-a-close-never-landed"); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, keys.RunBudget(run)).Val(); ttl <= 0 || ttl > maxCall {
		t.Fatalf("the reopen's budget hash lives %v; want it to lapse within the longest call (%v)", ttl, maxCall)
	}
}
