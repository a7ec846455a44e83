package runstate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// runBudgetEnv is a run budget and the tally beside it, on the test Redis.
type runBudgetEnv struct {
	budget *runstate.RunBudget
	tally  *runstate.Tally
	keys   runstate.Keys
	rdb    *redis.Client
}

func newRunBudget(t *testing.T) runBudgetEnv {
	rdb, prefix := testenv.Redis(t)
	keys := runstate.Keys{Prefix: prefix}
	return runBudgetEnv{runstate.NewRunBudget(rdb, keys, time.Hour, time.Hour, testStaleAfter), runstate.NewTally(rdb, keys, time.Hour), keys, rdb}
}

// testStaleAfter is how long the tests' reservations live without a beat.
const testStaleAfter = time.Minute

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
		granted []grant
	)
	start := make(chan struct{})
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			g, err := b.Reserve(ctx, run, callID(i), budget, want, least)
			if errors.Is(err, runstate.ErrRunBudget) {
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			granted = append(granted, grant{callID(i), g})
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	var sum int64
	for _, g := range granted {
		if g.micro < least || g.micro > want {
			t.Fatalf("granted %d, want between %d and %d", g.micro, least, want)
		}
		sum += g.micro
	}
	if sum != budget || len(granted) != 10 {
		t.Fatalf("%d calls granted %d in all, want 10 calls granted the whole cap %d", len(granted), sum, budget)
	}
	for _, g := range granted {
		if err := b.Release(ctx, run, g.call, pricing.Usage{Output: 1}, g.micro, false); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := tally.Get(ctx, run)
	if err != nil || got.CostMicro != budget || got.Calls != 10 {
		t.Fatalf("tally %+v, %v: want cost %d over 10 calls", got, err, budget)
	}
	if _, err := b.Reserve(ctx, run, "late", budget, want, 0); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve on a spent run: %v, want ErrRunBudget", err)
	}
}

// TestRunBudgetReleaseGivesBackWhatWasNotUsed: a call that spends less than it reserved
// leaves the rest to the run's next calls.
func TestRunBudgetReleaseGivesBackWhatWasNotUsed(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	g, err := b.Reserve(ctx, "r_rest", "a", 10_000, 4_000, 100)
	if err != nil || g != 4_000 {
		t.Fatalf("first reserve: %d, %v", g, err)
	}
	if g, err := b.Reserve(ctx, "r_rest", "b", 10_000, 10_000, 100); err != nil || g != 6_000 {
		t.Fatalf("reserve beside a call in flight: %d, %v; want the 6 000 it left", g, err)
	}
	if err := b.Release(ctx, "r_rest", "a", pricing.Usage{Input: 10}, 300, false); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, "r_rest", "c", 10_000, 10_000, 100); err != nil || g != 3_700 {
		t.Fatalf("reserve after the first call spent 300: %d, %v; want 10 000 - 300 - 6 000", g, err)
	}
}

// TestRunBudgetCountsWhatTheRunRecordsElsewhere: spentAtLeast (the run's row's record of its
// ended calls) is spent when the tally shows less — a Redis restart lost it — and changes
// nothing when the tally shows more.
func TestRunBudgetCountsWhatTheRunRecordsElsewhere(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	if g, err := b.ReserveAtMost(ctx, "r_floor", "a", 10_000, 10_000, 100, 0, 7_000); err != nil || g != 3_000 {
		t.Fatalf("reserve with 7 000 recorded and no tally: %d, %v; want the 3 000 left", g, err)
	}
	if err := b.Release(ctx, "r_floor", "a", pricing.Usage{Output: 10}, 8_000, false); err != nil {
		t.Fatal(err)
	}
	if g, err := b.ReserveAtMost(ctx, "r_floor", "b", 10_000, 10_000, 100, 0, 7_000); err != nil || g != 2_000 {
		t.Fatalf("reserve with 8 000 tallied and 7 000 recorded: %d, %v; want the 2 000 the tally leaves", g, err)
	}
	if _, err := b.ReserveAtMost(ctx, "r_floor2", "a", 10_000, 10_000, 100, 0, 9_950); err != runstate.ErrRunBudget {
		t.Fatalf("reserve with less than least left by the record: %v, want ErrRunBudget", err)
	}
}

// TestRunCloseWaitsForCallsInFlight: a run cannot be closed for settlement while a call of it
// runs (its usage would be left out); once closed, no call of it starts.
func TestRunCloseWaitsForCallsInFlight(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "r_close", "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseRun(ctx, "r_close"); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close with a call in flight: %v, want ErrRunBusy", err)
	}
	if err := b.Release(ctx, "r_close", "a", pricing.Usage{Output: 5}, 50, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseRun(ctx, "r_close"); err != nil {
		t.Fatalf("close with no call in flight: %v", err)
	}
	if _, err := b.Reserve(ctx, "r_close", "b", 10_000, 1_000, 100); !errors.Is(err, runstate.ErrRunClosed) {
		t.Fatalf("reserve on a closed run: %v, want ErrRunClosed", err)
	}
	// A run that never had a call closes at once.
	if _, err := b.CloseRun(ctx, "r_never"); err != nil {
		t.Fatalf("close of a run without calls: %v", err)
	}
}

// TestRunReopensOnlyForItsOwnClose: a settlement that fails reopens the run it closed, but
// not one another settlement closed since (a call could then start between that settlement's
// tally read and its commit, and go uncharged).
func TestRunReopensOnlyForItsOwnClose(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	first, err := b.CloseRun(ctx, "r_reopen")
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.CloseRun(ctx, "r_reopen")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ReopenRun(ctx, "r_reopen", first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "r_reopen", "a", 10_000, 1_000, 100); !errors.Is(err, runstate.ErrRunClosed) {
		t.Fatalf("reserve after the first settlement reopened a run the second had closed: %v, want ErrRunClosed", err)
	}
	if err := b.ReopenRun(ctx, "r_reopen", second); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, "r_reopen", "a", 10_000, 1_000, 100); err != nil || g != 1_000 {
		t.Fatalf("reserve once the run's last close was undone: %d, %v", g, err)
	}
}

// TestRunBudgetStepsAreSafeToRepeat: go-redis resends a script whose reply it lost, so a
// Reserve or a Release may run twice. A repeated Reserve returns the call's grant without
// taking more; a repeated Release neither tallies the call twice nor gives back another call's
// reservation.
func TestRunBudgetStepsAreSafeToRepeat(t *testing.T) {
	e := newRunBudget(t)
	b, tally := e.budget, e.tally
	ctx := context.Background()
	for range 2 {
		if g, err := b.Reserve(ctx, "r_again", "a", 10_000, 4_000, 100); err != nil || g != 4_000 {
			t.Fatalf("reserve of call a: %d, %v", g, err)
		}
	}
	if g, err := b.Reserve(ctx, "r_again", "b", 10_000, 10_000, 100); err != nil || g != 6_000 {
		t.Fatalf("reserve of call b: %d, %v; want the 6 000 call a left, once", g, err)
	}
	for range 2 {
		if err := b.Release(ctx, "r_again", "a", pricing.Usage{Output: 30}, 300, false); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := tally.Get(ctx, "r_again")
	if err != nil || got.CostMicro != 300 || got.Calls != 1 || got.Usage.Output != 30 {
		t.Fatalf("tally %+v, %v: want call a once", got, err)
	}
	if _, err := b.CloseRun(ctx, "r_again"); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close with call b in flight: %v, want ErrRunBusy", err)
	}
}

// TestRunBudgetDropsCallsOfADeadProcess: a reservation older than the longest a call can run
// belongs to a process that died mid-call. It no longer holds budget, nor keeps the run from
// being settled.
func TestRunBudgetDropsCallsOfADeadProcess(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	// A reservation made at the epoch's first millisecond, as a killed process leaves it.
	if err := e.rdb.HSet(ctx, e.keys.RunBudget("r_dead"), "c:dead", "9000:1").Err(); err != nil {
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, "r_dead", "a", 10_000, 10_000, 100); err != nil || g != 10_000 {
		t.Fatalf("reserve beside a dead call: %d, %v; want the whole budget", g, err)
	}
	if err := b.Release(ctx, "r_dead", "a", pricing.Usage{}, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, e.keys.RunBudget("r_dead"), "c:dead", "9000:1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseRun(ctx, "r_dead"); err != nil {
		t.Fatalf("close with only a dead call left: %v", err)
	}
}

// TestRunCloseWaitsForALeasedCall: a call that has outlived maxCall (a client that reads very
// slowly) is no longer counted by its reservation, but its process's lease still says it runs.
func TestRunCloseWaitsForALeasedCall(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	if err := e.rdb.HSet(ctx, e.keys.RunBudget("r_slow"), "c:slow", "9000:1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Set(ctx, e.keys.Lease("r_slow"), "other-process", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.budget.CloseRun(ctx, "r_slow"); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close with a leased call: %v, want ErrRunBusy", err)
	}
}

// TestRunBudgetReleaseOfAnExpiredReservationTallies: a call whose reservation hash expired
// under it (no call of the run started for maxCall) still tallies when it ends, once.
func TestRunBudgetReleaseOfAnExpiredReservationTallies(t *testing.T) {
	e := newRunBudget(t)
	b, tally := e.budget, e.tally
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "r_expire", "a", 10_000, 4_000, 100); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, e.keys.RunBudget("r_expire")).Err(); err != nil { // as if expired
		t.Fatal(err)
	}
	if err := b.Release(ctx, "r_expire", "a", pricing.Usage{Output: 1}, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if got, _, err := tally.Get(ctx, "r_expire"); err != nil || got.CostMicro != 1_000 {
		t.Fatalf("tally %+v, %v: want the call's 1 000", got, err)
	}
	if g, err := b.Reserve(ctx, "r_expire", "b", 10_000, 10_000, 100); err != nil || g != 9_000 {
		t.Fatalf("reserve after: %d, %v; want 9 000", g, err)
	}
}

// TestRunBudgetOfAFreeCallerFitsRedis: a caller at 100 % off has no cap in list-price terms;
// its figures are taken as MaxReservable, which Redis's scripts count exactly.
func TestRunBudgetOfAFreeCallerFitsRedis(t *testing.T) {
	b := newRunBudget(t).budget
	g, err := b.Reserve(context.Background(), "r_free", "a", pricing.MaxCost, pricing.MaxCost, 10)
	if err != nil || g != runstate.MaxReservable {
		t.Fatalf("reserve of an unbounded call at no cap: %d, %v; want %d", g, err, int64(runstate.MaxReservable))
	}
	if err := b.Release(context.Background(), "r_free", "a", pricing.Usage{Output: 1}, 10, false); err != nil {
		t.Fatal(err)
	}
}

type grant struct {
	call  string
	micro int64
}

func callID(i int) string { return fmt.Sprintf("call-%d", i) }

// TestRunBudgetReservationLivesByItsBeat: a reservation counts while the process serving its
// call beats it, however long the call runs, and stops counting staleAfter after the last
// beat — the lease TTL, not the longest a call may run: a process killed mid-call used to keep
// its run's budget reserved, and the run unsettleable, for that long.
func TestRunBudgetReservationLivesByItsBeat(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	serving := e.budget // the process serving call "a"
	other := runstate.NewRunBudget(e.rdb, e.keys, time.Hour, time.Hour, testStaleAfter)
	const run = "r_beat"
	field := e.keys.RunBudget(run)
	// stamp sets call a's last beat to ago before Redis's clock.
	stamp := func(ago time.Duration) {
		t.Helper()
		now, err := e.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.HSet(ctx, field, "c:a", fmt.Sprintf("10000:%d", now.Add(-ago).UnixMilli())).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if g, err := serving.Reserve(ctx, run, "a", 10_000, 10_000, 100); err != nil || g != 10_000 {
		t.Fatalf("reserve a: %d, %v", g, err)
	}

	// Its last beat long ago, then beaten: live again.
	stamp(2 * testStaleAfter)
	if lost, err := serving.Refresh(ctx); err != nil || len(lost) != 0 {
		t.Fatalf("beat: lost %v, %v", lost, err)
	}
	if _, err := other.Reserve(ctx, run, "b", 10_000, 5_000, 100); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve beside a beaten call: %v, want ErrRunBudget (its reservation still counts)", err)
	}
	if _, err := other.CloseRun(ctx, run); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close beside a beaten call: %v, want ErrRunBusy", err)
	}

	// Not beaten for a little less than staleAfter: still live.
	stamp(testStaleAfter - 5*time.Second)
	if _, err := other.Reserve(ctx, run, "b", 10_000, 5_000, 100); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve beside a call beaten %v ago: %v, want ErrRunBudget", testStaleAfter-5*time.Second, err)
	}
	// Not beaten for a little more (its process died): dropped, far sooner than maxCall (1 h here).
	stamp(testStaleAfter + 5*time.Second)
	if g, err := other.Reserve(ctx, run, "b", 10_000, 5_000, 100); err != nil || g != 5_000 {
		t.Fatalf("reserve beside a call not beaten for %v: %d, %v; want 5000", testStaleAfter+5*time.Second, g, err)
	}
	// Its process, still serving it after all (its beats were lost), learns at its next beat.
	lost, err := serving.Refresh(ctx)
	if err != nil || len(lost) != 1 || lost[0] != (runstate.RunCallID{Run: run, Call: "a"}) {
		t.Fatalf("beat after the reservation was dropped: lost %v, %v; want call a", lost, err)
	}
}

// TestRunBudgetReleasedCallIsNotBeatenBack: a released call's reservation is gone for good; the
// beat does not write it back (nor does a refused reservation enter the beat).
func TestRunBudgetReleasedCallIsNotBeatenBack(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	b := e.budget
	if _, err := b.Reserve(ctx, "r_rel", "a", 10_000, 10_000, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "r_rel", "b", 10_000, 10_000, 100); !errors.Is(err, runstate.ErrRunBudget) {
		t.Fatalf("reserve b: %v, want ErrRunBudget", err)
	}
	if b.Held() != 1 {
		t.Fatalf("beating %d reservations, want 1 (a refused one is not held)", b.Held())
	}
	if err := b.Release(ctx, "r_rel", "a", pricing.Usage{Output: 10}, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if b.Held() != 0 {
		t.Fatalf("beating %d reservations after the release, want 0", b.Held())
	}
	if lost, err := b.Refresh(ctx); err != nil || len(lost) != 0 {
		t.Fatalf("beat: lost %v, %v", lost, err)
	}
	if n, err := e.rdb.HExists(ctx, e.keys.RunBudget("r_rel"), "c:a").Result(); err != nil || n {
		t.Fatalf("released reservation present after a beat: %v, %v", n, err)
	}
}

// TestRunBudgetDoneMarkLivesAsLongAsTheTally: what keeps a repeated Release from tallying a
// call twice is its done mark. A repeat may come long after the first landed with its reply
// lost (the tally retried after the caller's slow read of the answer), so the mark must live
// as long as the tally it guards; living only as long as a call, it expired under a retry and
// the call was tallied, and charged, twice.
func TestRunBudgetDoneMarkLivesAsLongAsTheTally(t *testing.T) {
	e := newRunBudget(t) // tally_ttl 1 h, maxCall 1 h; a budget whose calls live a minute:
	b := runstate.NewRunBudget(e.rdb, e.keys, time.Hour, time.Minute, testStaleAfter)
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "r_mark", "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "r_mark", "a", pricing.Usage{Output: 10}, 500, false); err != nil {
		t.Fatal(err)
	}
	mark := e.rdb.PTTL(ctx, e.keys.CallDone("r_mark", "a")).Val()
	tally := e.rdb.PTTL(ctx, e.keys.Usage("r_mark")).Val()
	if mark < tally-time.Minute || tally <= 0 {
		t.Fatalf("done mark lives %v, the tally %v: a Release repeated after the mark is gone tallies the call again", mark, tally)
	}
	if err := b.Release(ctx, "r_mark", "a", pricing.Usage{Output: 10}, 500, false); err != nil {
		t.Fatal(err)
	}
	if u, _, _ := e.tally.Get(ctx, "r_mark"); u.Calls != 1 || u.CostMicro != 500 {
		t.Fatalf("tally after a repeated release: %+v, want one call of 500", u)
	}
}

// TestRunReopenOfALaterCloseKeepsAnEarlierOneClosed: two settlements of one run overlap. The
// first closes the run and is still committing; the second closes it too, fails in the
// database and reopens. The first settlement's tally read must still be final: no call of the
// run may start before it commits, or its usage is never charged.
func TestRunReopenOfALaterCloseKeepsAnEarlierOneClosed(t *testing.T) {
	b := newRunBudget(t).budget
	ctx := context.Background()
	if _, err := b.CloseRun(ctx, "r_reopen2"); err != nil { // the first settlement, still committing
		t.Fatal(err)
	}
	second, err := b.CloseRun(ctx, "r_reopen2")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ReopenRun(ctx, "r_reopen2", second); err != nil { // the second failed
		t.Fatal(err)
	}
	if g, err := b.Reserve(ctx, "r_reopen2", "c", 10_000, 1_000, 100); !errors.Is(err, runstate.ErrRunClosed) {
		t.Fatalf("reserve while the first settlement still commits: grant %d, %v; want ErrRunClosed", g, err)
	}
}

// TestRunBudgetLostReservationIsReportedOnce: a running call whose reservation was dropped as
// stale is reported by the next beat, once: its process beats every few seconds for as long as
// the call runs (up to upstream_timeout), and after a Redis outage had every reservation of a
// process dropped, each of them was logged again at every beat until its call ended.
func TestRunBudgetLostReservationIsReportedOnce(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run = "r_lost_once"
	if _, err := e.budget.Reserve(ctx, run, "a", 10_000, 1_000, 100); err != nil {
		t.Fatal(err)
	}
	// Another call of the run dropped it as stale.
	if err := e.rdb.HDel(ctx, e.keys.RunBudget(run), "c:a").Err(); err != nil {
		t.Fatal(err)
	}
	lost, err := e.budget.Refresh(ctx)
	if err != nil || len(lost) != 1 {
		t.Fatalf("first beat after the drop: lost %v, %v; want call a", lost, err)
	}
	for beat := range 3 {
		if lost, err := e.budget.Refresh(ctx); err != nil || len(lost) != 0 {
			t.Fatalf("beat %d after the drop was reported: lost %v, %v; want nothing", beat+2, lost, err)
		}
	}
	// The call still ends as every call does: tallied, its (gone) reservation given back.
	if err := e.budget.Release(ctx, run, "a", pricing.Usage{Output: 10}, 1_000, false); err != nil {
		t.Fatal(err)
	}
	if e.budget.Held() != 0 {
		t.Fatalf("beating %d reservations after the release, want 0", e.budget.Held())
	}
}

// TestRunCloseWaitsForACallsRecord: on a run whose Redis record lost calls (Lost), a call
// released before its record on the run's row (ReleaseBeforeRecord) keeps the run from closing
// until Recorded, however often its release is repeated, and gives its reservation back at
// once; a mark its process never dropped (killed between the two writes) stops counting after
// staleAfter. On a run whose record is whole the release marks nothing: its tally, with the
// call, is the larger record, and a settle need not wait.
func TestRunCloseWaitsForACallsRecord(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	if _, err := b.Reserve(ctx, "r_whole", "a", 10_000, 6_000, 100); err != nil {
		t.Fatal(err)
	}
	if marked, err := b.ReleaseBeforeRecord(ctx, "r_whole", "a", pricing.Usage{Output: 5}, 50, false); err != nil || marked {
		t.Fatalf("release of a call of a run whose record is whole: marked %v, %v; want no mark", marked, err)
	}
	if _, err := b.CloseRun(ctx, "r_whole"); err != nil {
		t.Fatalf("close of a run whose record is whole, its call tallied: %v", err)
	}

	if err := e.rdb.Set(ctx, e.keys.Lost("r_rec"), 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, "r_rec", "a", 10_000, 6_000, 100); err != nil {
		t.Fatal(err)
	}
	// Repeated (go-redis resends a script whose reply it lost), the release reports the mark
	// the first one set: its caller must drop it once the call is recorded.
	for i := range 2 {
		marked, err := b.ReleaseBeforeRecord(ctx, "r_rec", "a", pricing.Usage{Output: 5}, 50, false)
		if err != nil || !marked {
			t.Fatalf("release %d of a call of a run whose record lost calls: marked %v, %v; want the mark reported", i+1, marked, err)
		}
	}
	if got, _, err := e.tally.Get(ctx, "r_rec"); err != nil || got.Calls != 1 || got.CostMicro != 50 {
		t.Fatalf("tally %+v, %v after a repeated release: want the call once", got, err)
	}
	if g, err := b.Reserve(ctx, "r_rec", "b", 10_000, 9_950, 100); err != nil || g != 9_950 {
		t.Fatalf("reserve beside a released call: %d, %v; want all but its cost", g, err)
	}
	if err := b.Release(ctx, "r_rec", "b", pricing.Usage{}, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseRun(ctx, "r_rec"); !errors.Is(err, runstate.ErrRunBusy) {
		t.Fatalf("close with a call's record to come: %v, want ErrRunBusy", err)
	}
	if err := b.Recorded(ctx, "r_rec", "a"); err != nil {
		t.Fatal(err)
	}
	// Repeated after its record, the release leaves no mark.
	if marked, err := b.ReleaseBeforeRecord(ctx, "r_rec", "a", pricing.Usage{Output: 5}, 50, false); err != nil || marked {
		t.Fatalf("release repeated after the record: marked %v, %v", marked, err)
	}
	if _, err := b.CloseRun(ctx, "r_rec"); err != nil {
		t.Fatalf("close once the call is recorded: %v", err)
	}
	if tl := e.rdb.PTTL(ctx, e.keys.RunBudget("r_rec")).Val(); tl <= 0 {
		t.Fatalf("budget hash TTL %v", tl)
	}

	if err := e.rdb.HSet(ctx, e.keys.RunBudget("r_dead_rec"), "r:dead", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseRun(ctx, "r_dead_rec"); err != nil {
		t.Fatalf("close with only a dead call's record mark left: %v", err)
	}
}

// TestRunCallsMarkALossTheirSettlementCannotSee: after Redis lost a run's keys, the tally
// starts again with the calls since, and may cost more than the row's record of the calls
// before while having none of them; a settlement comparing the two sees no loss. So the run's
// calls mark it Lost — a release whose reservation found the tally short of what the row
// recorded, or that finds the call's own reservation gone — and their releases then mark their
// records to come. A run whose tally has what its row recorded is not marked.
func TestRunCallsMarkALossTheirSettlementCannotSee(t *testing.T) {
	e := newRunBudget(t)
	b := e.budget
	ctx := context.Background()
	lost := func(run string) bool {
		t.Helper()
		n, err := e.rdb.Exists(ctx, e.keys.Lost(run)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// The row records 50 and so does the tally: whole.
	if _, err := b.ReserveAtMost(ctx, "r_whole", "a", 10_000, 1_000, 100, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "r_whole", "a", pricing.Usage{Output: 5}, 50, false); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReserveAtMost(ctx, "r_whole", "b", 10_000, 1_000, 100, 0, 50); err != nil {
		t.Fatal(err)
	}
	if marked, err := b.ReleaseBeforeRecord(ctx, "r_whole", "b", pricing.Usage{Output: 40}, 400, false); err != nil || marked || lost("r_whole") {
		t.Fatalf("call of a whole run: marked %v, run lost %v, %v; want neither", marked, lost("r_whole"), err)
	}

	for _, when := range []string{"before the call", "during the call"} {
		run := "r_lost_" + when[:6]
		if when == "during the call" {
			if _, err := b.ReserveAtMost(ctx, run, "b", 10_000, 1_000, 100, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.rdb.Del(ctx, e.keys.RunBudget(run)).Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			// The row records 50 of a call whose tally is gone.
			if _, err := b.ReserveAtMost(ctx, run, "b", 10_000, 1_000, 100, 0, 50); err != nil {
				t.Fatal(err)
			}
		}
		marked, err := b.ReleaseBeforeRecord(ctx, run, "b", pricing.Usage{Output: 40}, 400, false)
		if err != nil || !marked || !lost(run) {
			t.Fatalf("%s: call released after a loss: marked %v, run lost %v, %v; want both", when, marked, lost(run), err)
		}
		if _, err := b.CloseRun(ctx, run); !errors.Is(err, runstate.ErrRunBusy) {
			t.Fatalf("%s: close with the call's record to come: %v, want ErrRunBusy", when, err)
		}
		if err := b.Recorded(ctx, run, "b"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.CloseRun(ctx, run); err != nil {
			t.Fatalf("%s: close once the call is recorded: %v", when, err)
		}
	}
}
