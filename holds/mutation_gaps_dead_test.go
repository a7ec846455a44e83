package holds_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
)

// Tests of the dead-instance sweep (holds/reconcile_dead.go) that no other test pins: each was
// written against a hand-made change of that code that every earlier test let pass (a
// mutation test).

// TestDeadInstanceNotDeclaredByAProcessBeatingForLessThanTheBound: a process that has watched
// another's beat stand still, its own beat fresh, still declares nobody dead until it has
// itself beaten without a gap for the whole bound: until then it cannot tell a dead process
// from a database it could not reach either.
func TestDeadInstanceNotDeclaredByAProcessBeatingForLessThanTheBound(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("young-self-user", 5, nil)
	self := e.beatingSelf()
	silent, err := e.store.RegisterInstance(e.ctx(), "silent", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_young_self", "", silent.ID(), holds.StateRunning)
	e.age(silent.ID(), 2*deadBound)
	e.watchStill(self)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = deadBound, self })
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
		t.Fatalf("pass by a process beating for %v of a %v bound: %+v, %v; want nobody declared dead", self.BeatingFor(), deadBound, st, err)
	}
	if row, r := e.instance(silent.ID()), e.run(u, h.RunID); row.DeadAt.Valid || r.State != holds.StateRunning {
		t.Fatalf("silent process: row %+v, its call %s; want alive and running", row, r.State)
	}
}

// TestDeadInstanceNotDeclaredByAProcessWhoseOwnBeatIsPastItsGap: a process that has beaten for
// the bound by its own clock and watched another's beat stand still declares nobody dead while
// its own last beat, by the database clock, is older than its gap — two gaps old here, short
// of any looser bound: the database may not have been there for it either.
func TestDeadInstanceNotDeclaredByAProcessWhoseOwnBeatIsPastItsGap(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("stale-self-user", 5, nil)
	silent, err := e.store.RegisterInstance(e.ctx(), "silent", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_stale_self", "", silent.ID(), holds.StateRunning)
	e.age(silent.ID(), 2*deadBound)
	self, err := e.store.RegisterInstance(e.ctx(), "stale-self", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	waitBeating(t, self, 100*time.Millisecond)
	if err := self.Beat(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.watchStill(self)
	e.age(self.ID(), 2*self.Gap())
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
		t.Fatalf("pass by a process whose own beat is %v old by the database clock (gap %v): %+v, %v; want nobody declared dead",
			2*self.Gap(), self.Gap(), st, err)
	}
	if row, r := e.instance(silent.ID()), e.run(u, h.RunID); row.DeadAt.Valid || r.State != holds.StateRunning {
		t.Fatalf("silent process: row %+v, its call %s; want alive and running", row, r.State)
	}
}

// sweepDeadlines is a lease checker that records the deadline of each question's context.
type sweepDeadlines struct {
	leaseKeys
	mu    sync.Mutex
	left  []time.Duration // time.Until(deadline) when asked; 0 for no deadline
	runID []string
}

func (l *sweepDeadlines) Exists(ctx context.Context, runID string) (bool, error) {
	var left time.Duration
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	l.mu.Lock()
	l.left, l.runID = append(l.left, left), append(l.runID, runID)
	l.mu.Unlock()
	return l.leaseKeys.Exists(ctx, runID)
}

// TestDeadSweepAsksWithinAQuarterOfThePassBudget: the sweep of dead instances has a quarter of
// the pass's budget, from the pass's start: its questions (a lease each) carry a deadline no
// further off than that, so that a sweep held up (Redis slow, a backlog of dead holds) leaves the
// scan the rest. With the whole budget, a slow sweep took the scan's time too.
func TestDeadSweepAsksWithinAQuarterOfThePassBudget(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("sweep-quarter-user", 5, nil)
	stopped, err := e.store.RegisterInstance(e.ctx(), "stopped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_sweep_quarter", "", stopped.ID(), holds.StateRunning)
	if err := stopped.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	const budget = 40 * time.Second
	lk := &sweepDeadlines{leaseKeys: leaseKeys{e.rdb, e.keys}}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.PassBudget, c.Leases = deadBound, budget, lk })
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 1 || st.ChargedHeld != 1 {
		t.Fatalf("pass: %+v, %v; want the retired process's hold brought in and charged its hold", st, err)
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	// The sweep asks first, then the scan asks again of the hold it brought in.
	if len(lk.left) != 2 || lk.runID[0] != h.RunID {
		t.Fatalf("lease questions %v; want 2 of %s, the sweep's then the scan's", lk.runID, h.RunID)
	}
	if left := lk.left[0]; left <= 0 || left > budget/4 {
		t.Errorf("the sweep asked with %v left before its deadline; want a deadline within a quarter of the %v budget", left, budget)
	}
}

// TestDeadInstancesDeclaredAtMostMaxPerPass: a pass declares at most maxDeadPerPass instances
// dead, however many it has watched stand still; the rest are declared by the next passes.
func TestDeadInstancesDeclaredAtMostMaxPerPass(t *testing.T) {
	defer holds.SetMaxDeadPerPass(1)()
	e := newStoreEnv(t)
	self := e.beatingSelf()
	for _, name := range []string{"silent-a", "silent-b"} {
		in, err := e.store.RegisterInstance(e.ctx(), name, 50*time.Millisecond, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		e.age(in.ID(), 2*deadBound)
	}
	waitBeating(t, self, 100*time.Millisecond)
	e.watchStill(self)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })
	for pass, want := range []int{1, 1, 0} {
		if st, err := e.pass(rec); err != nil || st.DeadInstances != want {
			t.Fatalf("pass %d over two silent processes, one declared a pass: %+v, %v; want %d declared", pass+1, st, err, want)
		}
	}
}

// TestDeadRowStoppedByTheSweepsTimeGoesBehindTheOthers: a dead row whose leased holds run the
// sweep out of its time (Redis slow to answer) before it reaches their end, having had the
// pass to itself, goes behind the rows after it, as one that fills the pass's batches does:
// the killed process's row behind it is swept by the next pass. Kept first, it stopped every
// pass until its own holds were read to their end, and the call of the row behind kept its
// caller's in-flight slot a pass per leased hold longer.
func TestDeadRowStoppedByTheSweepsTimeGoesBehindTheOthers(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("slow-sweep-rows", 20, nil)
	leases := runstate.NewLeases(e.rdb, e.keys, "cut-off-process", time.Minute, time.Second, e.log)
	slow, err := e.store.RegisterInstance(e.ctx(), "cut-off-slow", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		leases.Acquire(e.admitBy(u, fmt.Sprintf("r_a_slow_leased_%d", i), "", slow.ID(), holds.StateRunning).RunID)
	}
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if err := slow.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	killed, err := e.store.RegisterInstance(e.ctx(), "killed-behind", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	behind := e.admitBy(u, "r_b_behind", "", killed.ID(), holds.StateRunning)
	if err := killed.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	// One hold a batch, batches to spare: each pass's sweep runs out of time at its second question.
	lk := &budgetLeases{leaseKeys: leaseKeys{e.rdb, e.keys}, per: 2}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.DeadAfter, c.Batch, c.MaxBatches, c.PassBudget, c.Leases = deadBound, 1, 10, 2*time.Second, lk
	})
	for pass := 1; pass <= 2; pass++ {
		lk.newPass()
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	if r := e.run(u, behind.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold {
		t.Errorf("call of the row behind the slow one: %s by %q after two passes, want settled at its hold", r.State, r.SettleSource.String)
	}
	if row := e.instance(killed.ID()); !row.SweptAt.Valid {
		t.Errorf("row behind the slow one: %+v after two passes, want swept", row)
	}
}

// TestDeadSweepReadsAtMostMaxBatchesBatches: the sweep of dead instances reads at most
// MaxBatches batches of their holds a pass, as the scan does: with one hold a batch and one
// batch a pass, a killed process's three calls are brought in one at most a pass (the row,
// having filled a pass, goes behind the others, and comes round again with the next), and the
// row is swept once a pass has read it from its first hold and found none left.
func TestDeadSweepReadsAtMostMaxBatchesBatches(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("sweep-batches-user", 5, nil)
	stopped, err := e.store.RegisterInstance(e.ctx(), "stopped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.admitBy(u, fmt.Sprintf("r_sweep_batch_%d", i), "", stopped.ID(), holds.StateRunning)
	}
	if err := stopped.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Batch, c.MaxBatches = deadBound, 1, 1 })
	brought := 0
	for pass := 1; pass <= 8 && brought < 3; pass++ {
		st, err := e.pass(rec)
		if err != nil || st.BroughtIn > 1 || st.ChargedHeld != st.BroughtIn {
			t.Fatalf("pass %d, one hold a batch, one batch a pass: %+v, %v; want at most one hold brought in, and charged", pass, st, err)
		}
		brought += st.BroughtIn
	}
	if brought != 3 {
		t.Fatalf("%d of the 3 holds brought in after 8 passes, want all", brought)
	}
	// Read to their end from where a pass stopped, the row's holds are read again from the
	// first by a later pass, which finds none left and sweeps the row.
	for pass := 1; pass <= 4 && !e.instance(stopped.ID()).SweptAt.Valid; pass++ {
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	if row := e.instance(stopped.ID()); !row.SweptAt.Valid {
		t.Errorf("row %+v with no live hold left, 4 passes after its last was brought in; want swept", row)
	}
}

// TestDeadSweepReadsNoRowItSweptBefore: a dead row once swept is never read again: the rows a
// pass reads (at most maxDeadPerPass) are those not swept yet, so a swept one takes no place of
// a row whose calls wait to be brought in.
func TestDeadSweepReadsNoRowItSweptBefore(t *testing.T) {
	defer holds.SetMaxDeadPerPass(2)()
	e := newStoreEnv(t)
	u := e.user("swept-rows-user", 5, nil)
	retire := func(name string, withHold bool) *holds.Instance {
		t.Helper()
		in, err := e.store.RegisterInstance(e.ctx(), name, 50*time.Millisecond, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		if withHold {
			e.admitBy(u, "r_"+name, "", in.ID(), holds.StateRunning)
		}
		if err := in.Retire(e.ctx()); err != nil {
			t.Fatal(err)
		}
		return in
	}
	clean := retire("stopped-clean", false)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter = deadBound })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	if row := e.instance(clean.ID()); !row.SweptAt.Valid {
		t.Fatalf("row retired with no hold: %+v after a pass, want swept", row)
	}
	retire("stopped-b", true)
	retire("stopped-c", true)
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 2 || st.ChargedHeld != 2 {
		t.Fatalf("pass over two rows retired with a hold each, behind one swept before: %+v, %v; want both holds brought in and charged", st, err)
	}
}

// TestDeadInstanceDeclaredByAnotherMeanwhileIsNotDeclaredAgain: another process declares a
// silent instance dead while this pass is declaring it too (its declaration still committing
// when this pass's reaches the row). This pass waits for it and, the row dead by then, leaves
// it: it counts no death of its own and keeps the row's moment of death, by which the dead
// rows are read in order.
func TestDeadInstanceDeclaredByAnotherMeanwhileIsNotDeclaredAgain(t *testing.T) {
	e := newStoreEnv(t)
	self := e.beatingSelf()
	silent, err := e.store.RegisterInstance(e.ctx(), "silent", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	e.age(silent.ID(), 2*deadBound)
	waitBeating(t, self, 100*time.Millisecond)
	e.watchStill(self)
	other := testenv.ConsoleTx(t, e.db)
	if _, err := other.ExecContext(e.ctx(), "UPDATE instances SET dead_at = NOW(6) WHERE id = ?", silent.ID()); err != nil {
		t.Fatal(err)
	}
	obs, err := e.db.Connx(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })
	type result struct {
		st  holds.Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := rec.RunForced(context.Background())
		done <- result{st, err}
	}()
	waitLockWaits(t, obs, 1)
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	declaredAt := e.instance(silent.ID()).DeadAt
	res := <-done
	if res.err != nil || res.st.DeadInstances != 0 {
		t.Fatalf("pass declaring a row another process declared meanwhile: %+v, %v; want no death counted", res.st, res.err)
	}
	if row := e.instance(silent.ID()); !row.DeadAt.Valid || !row.DeadAt.Time.Equal(declaredAt.Time) {
		t.Fatalf("row dead at %v after the pass, want the other process's %v", row.DeadAt, declaredAt)
	}
}

// TestDeadRowWithOnlyANamedRunLeasedIsSwept: a named run is never brought in (it lives between
// its calls, other processes may serve it), so its lease keeps nothing of a dead row: a row
// whose only live hold is a leased named run is swept by the first pass, as one with no live
// hold is.
func TestDeadRowWithOnlyANamedRunLeasedIsSwept(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("named-leased-user", 5, nil)
	stopped, err := e.store.RegisterInstance(e.ctx(), "stopped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	named := e.admitBy(u, "r_named_leased", "agent-run", stopped.ID(), holds.StateRunning)
	leases := runstate.NewLeases(e.rdb, e.keys, "other-process", time.Minute, time.Second, e.log)
	leases.Acquire(named.RunID)
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if err := stopped.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter = deadBound })
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 0 {
		t.Fatalf("pass: %+v, %v; want nothing brought in", st, err)
	}
	if row := e.instance(stopped.ID()); !row.SweptAt.Valid {
		t.Errorf("row %+v whose only live hold is a named run, after a pass; want swept", row)
	}
	if r := e.run(u, named.RunID); r.State != holds.StateRunning {
		t.Errorf("named run %s: %s, want left running", named.RunID, r.State)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: named.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
