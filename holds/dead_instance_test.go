package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// deadBound is the dead-instance bound of these tests: an hour, which the tests make pass by
// moving a dead process's beat and holds an hour and more into the past.
const deadBound = time.Hour

// beatingSelf registers the reconciling process's instance and beats it until the test ends;
// beatingFor is how long the test says it has beaten without a gap (Instance.BeatingFor).
func (e *storeEnv) beatingSelf() *holds.Instance {
	e.t.Helper()
	self, err := e.store.RegisterInstance(e.ctx(), "reconciler", 50*time.Millisecond, 0, e.log)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); self.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	return self
}

// admitBy takes a one-call hold (or a named run's, with clientRunID) stamped with an instance.
func (e *storeEnv) admitBy(u holds.User, runID, clientRunID, servedBy string, state holds.State) holds.Hold {
	e.t.Helper()
	h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, ClientRunID: clientRunID, Model: "fake-gpt",
		State: state, TTL: 24 * time.Hour, ServedBy: servedBy})
	if err != nil {
		e.t.Fatalf("admit %s: %v", runID, err)
	}
	return h
}

// age moves an instance's beat and the creation of its holds back by d, as if it had beaten
// and admitted them d ago and then gone silent.
func (e *storeEnv) age(instanceID string, d time.Duration) {
	e.t.Helper()
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE instances SET started_at = started_at - INTERVAL ? MICROSECOND, beat_at = beat_at - INTERVAL ? MICROSECOND WHERE id = ?",
		d.Microseconds(), d.Microseconds(), instanceID); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET created_at = created_at - INTERVAL ? MICROSECOND WHERE served_by = ?",
		d.Microseconds(), instanceID); err != nil {
		e.t.Fatal(err)
	}
}

// watchStill has self read the other rows' beats, then moves its watch's clock on by a minute,
// past the gap of every beat in these tests: a row that does not beat meanwhile has stood still
// for self, as a killed process's does.
func (e *storeEnv) watchStill(self *holds.Instance) {
	e.t.Helper()
	if err := self.Watch(e.ctx()); err != nil {
		e.t.Fatal(err)
	}
	self.SkewWatch(time.Minute)
}

func (e *storeEnv) instance(id string) holds.InstanceRow {
	e.t.Helper()
	rows, err := e.store.ListInstances(e.ctx(), "", 100)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, r := range rows {
		if r.ID == id {
			return r
		}
	}
	e.t.Fatalf("instance %s: no row", id)
	return holds.InstanceRow{}
}

// TestDeadInstanceHoldsSettledBeforeTheirExpiry: a process killed with calls in flight stops
// beating; a reconcile pass by a process that has beaten all along declares it dead and
// settles its one-call holds by DESIGN §5's rules a day before they would expire — from the
// tally, at the hold, released — and frees the caller's in-flight slots. Nothing else moves:
// a call whose lease lives (its process was alive after all) keeps its expiry, and its
// process stays unswept until that lease lapses; a named run and a hold admitted after the
// dead process's last beat wait for their expiry, as do the holds of a live process and a
// hold no process stamped.
func TestDeadInstanceHoldsSettledBeforeTheirExpiry(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("sidecar-user", 6, nil)
	other := e.user("other-user", 3, nil)
	self := e.beatingSelf()
	dead, err := e.store.RegisterInstance(e.ctx(), "killed", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	deadID := dead.ID() // never beats: killed right after it admitted its calls

	tallied := e.admitBy(u, "r_dead_tallied", "", deadID, holds.StateRunning)
	lost := e.admitBy(u, "r_dead_lost", "", deadID, holds.StateRunning)
	queued := e.admitBy(u, "r_dead_queued", "", deadID, holds.StateQueued)
	leased := e.admitBy(u, "r_dead_leased", "", deadID, holds.StateRunning)
	named := e.admitBy(u, "r_dead_named", "agent-1", deadID, holds.StateRunning)
	e.age(deadID, 2*deadBound)
	late := e.admitBy(u, "r_dead_late", "", deadID, holds.StateRunning) // admitted after its last beat: alive then
	mine := e.admitBy(other, "r_live", "", self.ID(), holds.StateRunning)
	unstamped := e.admitBy(other, "r_unstamped", "", "", holds.StateRunning)

	e.addTally(tallied.RunID, pricing.Usage{Input: 900, Output: 100}, 3_250)
	leases := runstate.NewLeases(e.rdb, e.keys, "paused-process", time.Minute, time.Second, e.log)
	leases.Acquire(leased.RunID)
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	// The caller's six slots are all taken: a seventh call is refused.
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_seventh", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); !isTooMany(err) {
		t.Fatalf("seventh call before the pass: %v, want too many in flight", err)
	}
	before := map[string]time.Time{}
	for _, id := range []string{leased.RunID, named.RunID, late.RunID, mine.RunID, unstamped.RunID} {
		before[id] = e.runAny(id).ExpiresAt
	}

	waitBeating(t, self, 200*time.Millisecond)
	e.watchStill(self)
	deaths := 0
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.DeadAfter, c.Self = 200*time.Millisecond, self
		c.OnDeadInstances = func(n int) { deaths += n }
	})
	st, err := e.pass(rec)
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	if st.DeadInstances != 1 || st.BroughtIn != 3 || st.FromTally != 1 || st.ChargedHeld != 1 || st.Released != 1 || st.Extended != 0 || deaths != 1 {
		t.Errorf("pass: %+v, %d dead reported; want 1 instance declared dead, 3 holds brought in: 1 from tally, 1 at hold, 1 released", st, deaths)
	}
	for id, want := range map[string]string{tallied.RunID: holds.SourceReconcile, lost.RunID: holds.SourceReconcileHold, queued.RunID: holds.SourceRelease} {
		if r := e.run(u, id); r.State != holds.StateSettled || r.SettleSource.String != want {
			t.Errorf("%s: %s by %q, want settled by %s", id, r.State, r.SettleSource.String, want)
		}
	}
	if r := e.run(u, tallied.RunID); r.ChargedMicro != 3_250 || r.InTok != 900 || r.OutTok != 100 {
		t.Errorf("tallied call charged %d (in %d out %d), want its tally 3250 (900, 100)", r.ChargedMicro, r.InTok, r.OutTok)
	}
	if r := e.run(u, lost.RunID); r.ChargedMicro != lost.HeldMicro {
		t.Errorf("call without a tally charged %d, want its hold %d", r.ChargedMicro, lost.HeldMicro)
	}
	for id, exp := range before {
		if r := e.runAny(id); r.State != holds.StateRunning || !r.ExpiresAt.Equal(exp) {
			t.Errorf("%s: %s expiring %v, want untouched (running, %v)", id, r.State, r.ExpiresAt, exp)
		}
	}
	if got, want := e.ledgerUsed(u), 3_250+lost.HeldMicro; got != want {
		t.Errorf("day ledger %d, want %d", got, want)
	}
	if row := e.instance(deadID); !row.DeadAt.Valid || row.SweptAt.Valid {
		t.Errorf("dead instance row %+v, want dead, and not swept while a hold of it is leased", row)
	}
	if row := e.instance(self.ID()); row.DeadAt.Valid {
		t.Errorf("the reconciling process declared itself dead: %+v", row)
	}
	// Three slots are free again (the leased call, the named run and the late call still
	// hold theirs): the caller works on without waiting a day for the expiry.
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_seventh", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Errorf("seventh call after the pass: %v, want admitted", err)
	}
	// A second pass, the lease still there, finds nothing more to do.
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 || st.Scanned != 0 {
		t.Errorf("second pass: %+v, %v; want nothing", st, err)
	}
	// The lease lapses (the call it covered has ended without a settlement of its own): the
	// next pass brings that hold in, charges it, and the dead process is swept.
	if err := leases.Release(e.ctx(), leased.RunID); err != nil {
		t.Fatal(err)
	}
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 1 || st.ChargedHeld != 1 {
		t.Errorf("pass after the lease lapsed: %+v, %v; want its hold brought in and charged", st, err)
	}
	if row := e.instance(deadID); !row.SweptAt.Valid {
		t.Errorf("dead instance row %+v, want swept once no hold of it is live", row)
	}

	// The killed process was only paused: its next beat finds its row dead and registers a
	// new one, which the next pass leaves alone, as it does the holds admitted under it.
	if err := dead.Beat(e.ctx()); err != nil {
		t.Fatal(err)
	}
	// Its call, settled under it at its hold, ends now: its own settlement changes nothing.
	used := e.ledgerUsed(u)
	if res, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: lost.RunID, UserID: u.ID, CostMicro: 1_234, Source: holds.SourceComplete}); err != nil || res.Applied {
		t.Errorf("the resumed call's own settlement: %+v, %v; want nothing applied", res, err)
	}
	if got := e.ledgerUsed(u); got != used {
		t.Errorf("day ledger %d after the resumed call's settlement, want %d", got, used)
	}
	if dead.ID() == deadID {
		t.Fatal("a process declared dead beat on under its dead id")
	}
	again := e.admitBy(u, "r_after_resume", "", dead.ID(), holds.StateRunning)
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
		t.Errorf("pass after the process came back: %+v, %v; want nothing declared, nothing brought in", st, err)
	}
	if row := e.instance(dead.ID()); row.DeadAt.Valid {
		t.Errorf("the process's new row: %+v, want alive", row)
	}
	for _, id := range []string{named.RunID, late.RunID, mine.RunID, unstamped.RunID, again.RunID, "r_seventh"} {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeadInstancesDeclaredOnlyByAProcessThatBeat: after a database outage every process's
// beat is stale, the live ones' too. A process whose own beats have not reached the database
// for the whole bound declares nobody dead (nor does an operator's one-off pass, which has no
// beat of its own); one that has, does. A process retired at shutdown is swept by any pass.
func TestDeadInstancesDeclaredOnlyByAProcessThatBeat(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("outage-user", 5, nil)
	self := e.beatingSelf()
	silent, err := e.store.RegisterInstance(e.ctx(), "silent", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_silent", "", silent.ID(), holds.StateRunning)
	e.age(silent.ID(), 2*deadBound)
	// A process whose own bound is longer (its leases live longer) is held to it.
	patient, err := e.store.RegisterInstance(e.ctx(), "patient", 50*time.Millisecond, 3*deadBound, e.log)
	if err != nil {
		t.Fatal(err)
	}
	ph := e.admitBy(u, "r_patient", "", patient.ID(), holds.StateRunning)
	e.age(patient.ID(), 2*deadBound)

	for name, self := range map[string]*holds.Instance{"a process beating for less than the bound": self, "a one-off pass": nil} {
		rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = deadBound, self })
		st, err := e.pass(rec)
		if err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
			t.Errorf("%s: %+v, %v; want nobody declared dead", name, st, err)
		}
		if row := e.instance(silent.ID()); row.DeadAt.Valid {
			t.Errorf("%s declared a process dead: %+v", name, row)
		}
	}
	// The database clock steps forward past the bound: every beat looks stale, the declaring
	// process's own last one too, though its local clock says it beat without a gap. It
	// declares nobody dead until its own beat is fresh again.
	stepped, err := e.store.RegisterInstance(e.ctx(), "stepped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	waitBeating(t, stepped, 100*time.Millisecond)
	e.age(stepped.ID(), 2*deadBound)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, stepped })
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 {
		t.Errorf("a process whose own beat is stale by the database clock: %+v, %v; want nobody declared dead", st, err)
	}
	if err := stepped.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}

	waitBeating(t, self, 100*time.Millisecond)
	e.watchStill(self)
	rec = e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 1 || st.ChargedHeld != 1 {
		t.Errorf("a process that beat all along: %+v, %v; want the silent one declared dead and its call charged its hold", st, err)
	}
	if r := e.run(u, h.RunID); r.SettleSource.String != holds.SourceReconcileHold {
		t.Errorf("silent process's call: %q, want reconcile_hold", r.SettleSource.String)
	}
	if row, r := e.instance(patient.ID()), e.run(u, ph.RunID); row.DeadAt.Valid || r.State != holds.StateRunning {
		t.Errorf("process silent for 2 h with a bound of 3 h: row %+v, its call %s; want alive and running", row, r.State)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: ph.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}

	// Shut down with a settlement that failed in its drain: retired, its hold is brought in
	// by the next pass, one-off or not, with no bound to wait.
	stopped, err := e.store.RegisterInstance(e.ctx(), "stopped", 50*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	left := e.admitBy(u, "r_left_at_shutdown", "", stopped.ID(), holds.StateRunning)
	e.addTally(left.RunID, pricing.Usage{Input: 10, Output: 10}, 125)
	if err := stopped.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	rec = e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter = deadBound })
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 1 || st.FromTally != 1 {
		t.Errorf("pass after a shutdown that left a hold: %+v, %v; want it brought in and settled from its tally", st, err)
	}
	if r := e.run(u, left.RunID); r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 125 {
		t.Errorf("hold left at shutdown: %q charged %d, want reconcile at 125", r.SettleSource.String, r.ChargedMicro)
	}
}

// TestLiveInstanceNotDeclaredDeadByASteppedClock: the database clock steps forward past the
// bound between a live process's last beat and another's pass, after the passing process's
// own beat: by the database clock the live one's beat is stale and the passing one's fresh.
// The passing process has watched the live one's beat move within its gap, so it declares
// nobody dead, and the live process's call — younger than a heartbeat, without a lease yet —
// keeps its hold. Once that beat stands still, by the passing process's own clock, for longer
// than its gap, the process is declared dead.
func TestLiveInstanceNotDeclaredDeadByASteppedClock(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("stepped-user", 5, nil)
	self := e.beatingSelf()
	live, err := e.store.RegisterInstance(e.ctx(), "live", 50*time.Millisecond, 0, e.log) // beaten by hand
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_young_call", "", live.ID(), holds.StateRunning)
	before := e.runAny(h.RunID).ExpiresAt
	waitBeating(t, self, 100*time.Millisecond)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })

	e.watchStill(self) // a minute on by self's clock, in which the live process beat:
	if err := live.Beat(e.ctx()); err != nil {
		t.Fatal(err)
	}
	e.age(live.ID(), 2*deadBound) // and then the database clock stepped two hours forward
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
		t.Errorf("pass after the step: %+v, %v; want nobody declared dead", st, err)
	}
	if row, r := e.instance(live.ID()), e.runAny(h.RunID); row.DeadAt.Valid || r.State != holds.StateRunning || !r.ExpiresAt.Equal(before) {
		t.Errorf("live process after the pass: row %+v, its call %s expiring %v (was %v); want alive, running, untouched", row, r.State, r.ExpiresAt, before)
	}

	self.SkewWatch(time.Minute) // the live process goes silent for a minute by self's clock
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 1 || st.ChargedHeld != 1 {
		t.Errorf("pass once its beat stood still: %+v, %v; want it declared dead and its call charged its hold", st, err)
	}
}

// TestSlowBeatingInstanceIsHeldToItsOwnGap: processes may beat at different intervals
// (holds.heartbeat_interval is each process's own), so a row is taken for stood still only once
// its beat has stood still for longer than the gap its own interval allows (its row's
// max_gap_us), not the declaring process's: a process beating every 10 s whose beat has stood
// still for 24 s (past the declaring process's gap and its own interval, one beat missed) lives.
func TestSlowBeatingInstanceIsHeldToItsOwnGap(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("slow-beat-user", 5, nil)
	self := e.beatingSelf()
	slow, err := e.store.RegisterInstance(e.ctx(), "slow", 10*time.Second, 0, e.log) // beaten by hand
	if err != nil {
		t.Fatal(err)
	}
	h := e.admitBy(u, "r_slow_call", "", slow.ID(), holds.StateRunning)
	e.age(slow.ID(), 2*deadBound) // stale by the database clock: only the watch can tell it lives
	waitBeating(t, self, 100*time.Millisecond)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Self = 100*time.Millisecond, self })
	if err := self.Watch(e.ctx()); err != nil {
		t.Fatal(err)
	}
	self.SkewWatch(slow.Gap() - time.Second)
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 0 || st.BroughtIn != 0 {
		t.Errorf("pass with the slow process's beat still for %v (its gap %v, the declaring one's %v): %+v, %v; want nobody declared dead",
			slow.Gap()-time.Second, slow.Gap(), self.Gap(), st, err)
	}
	if r := e.runAny(h.RunID); r.State != holds.StateRunning {
		t.Errorf("slow process's call after the pass: %s, want running", r.State)
	}
	self.SkewWatch(2 * time.Second) // now past its own gap: it was killed
	if st, err := e.pass(rec); err != nil || st.DeadInstances != 1 || st.ChargedHeld != 1 {
		t.Errorf("pass once its beat stood still past its own gap: %+v, %v; want it declared dead and its call charged its hold", st, err)
	}
}

// TestDeadRowsKeptByLeasesDoNotHideTheOthers: a dead row whose holds are still leased (its
// process alive, cut off from the database) stays unswept, and is read again by later passes.
// A pass reads a bounded window of dead rows; a window of such rows read from the oldest every
// pass kept the dead rows behind it from ever being swept, their calls waiting for their
// expiry. Passes go on from where the last one left off, as the scan does.
func TestDeadRowsKeptByLeasesDoNotHideTheOthers(t *testing.T) {
	defer holds.SetMaxDeadPerPass(2)()
	e := newStoreEnv(t)
	u := e.user("window-user", 5, nil)
	leases := runstate.NewLeases(e.rdb, e.keys, "cut-off-processes", time.Minute, time.Second, e.log)
	retired := func(name string, leased bool) holds.Hold {
		in, err := e.store.RegisterInstance(e.ctx(), name, 50*time.Millisecond, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		h := e.admitBy(u, "r_"+name, "", in.ID(), holds.StateRunning)
		if leased {
			leases.Acquire(h.RunID)
		}
		if err := in.Retire(e.ctx()); err != nil {
			t.Fatal(err)
		}
		return h
	}
	retired("cut-off-a", true)
	retired("cut-off-b", true)
	behind := retired("killed-behind", false)
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	// The reconciling process's lines name it (as cmd/gateway's logger does); a dead row's name
	// theirs apart, under keys of their own: a line with one key twice is read by most log
	// pipelines as its last value.
	core, logs := observer.New(zap.InfoLevel)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.DeadAfter, c.Log = deadBound, zap.New(core).With(zap.String("instance", "me"))
	})
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 0 {
		t.Fatalf("first pass, over the two leased rows: %+v, %v; want nothing brought in", st, err)
	}
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 1 || st.ChargedHeld != 1 {
		t.Fatalf("second pass: %+v, %v; want the row behind them swept, its call charged its hold", st, err)
	}
	if r := e.run(u, behind.RunID); r.State != holds.StateSettled {
		t.Errorf("call of the row behind: %s, want settled", r.State)
	}
	swept := logs.FilterMessageSnippet("instance shut down leaving holds").All()
	if len(swept) != 1 {
		t.Fatalf("%d lines saying the row behind was swept, want 1", len(swept))
	}
	seen := map[string]bool{}
	for _, f := range swept[0].Context {
		if seen[f.Key] {
			t.Errorf("key %q twice in the line %q", f.Key, swept[0].Message)
		}
		seen[f.Key] = true
	}
	if f := swept[0].ContextMap(); f["instance"] != "me" || f["dead_instance"] != "killed-behind" {
		t.Errorf("line names instance %v and dead instance %v, want me and killed-behind", f["instance"], f["dead_instance"])
	}
	// The rows reached their end: the next pass reads the leased ones again.
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 0 {
		t.Fatalf("third pass: %+v, %v", st, err)
	}
	for _, name := range []string{"cut-off-a", "cut-off-b"} {
		if r := e.runAny("r_" + name); r.State != holds.StateRunning {
			t.Errorf("leased call %s: %s, want left running", name, r.State)
		}
	}
}

// TestDeadRowThatFillsAPassDoesNotStallTheOthers: a dead row whose leased holds alone fill a
// pass's batches stopped every pass there, and the rows behind it were never swept. Having had
// a pass to itself, it goes behind them.
func TestDeadRowThatFillsAPassDoesNotStallTheOthers(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("stall-user", 5, nil)
	leases := runstate.NewLeases(e.rdb, e.keys, "cut-off-process", time.Minute, time.Second, e.log)
	register := func(name string) *holds.Instance {
		in, err := e.store.RegisterInstance(e.ctx(), name, 50*time.Millisecond, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	full := register("cut-off-full")
	for _, id := range []string{"r_full_1", "r_full_2"} {
		leases.Acquire(e.admitBy(u, id, "", full.ID(), holds.StateRunning).RunID)
	}
	behind := register("killed-behind")
	h := e.admitBy(u, "r_behind", "", behind.ID(), holds.StateRunning)
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	for _, in := range []*holds.Instance{full, behind} {
		if err := in.Retire(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	// One hold a batch, one batch a pass: the full row's first leased hold fills the pass.
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Batch, c.MaxBatches = deadBound, 1, 1 })
	for pass := 1; pass <= 3; pass++ {
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	if r := e.run(u, h.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold {
		t.Errorf("call of the row behind: %s by %q after three passes, want settled at its hold", r.State, r.SettleSource.String)
	}
}

// runAny reads a hold's state and expiry, whoever its user.
func (e *storeEnv) runAny(runID string) holds.Run {
	e.t.Helper()
	var r holds.Run
	if err := e.db.GetContext(e.ctx(), &r, "SELECT run_id, state, expires_at FROM run_holds WHERE run_id = ?", runID); err != nil {
		e.t.Fatalf("run %s: %v", runID, err)
	}
	return r
}

func isTooMany(err error) bool {
	var busy *holds.TooManyInFlightError
	return errors.As(err, &busy)
}

// waitBeating waits until self has beaten without a gap for d.
func waitBeating(t *testing.T, self *holds.Instance, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for self.BeatingFor() < d {
		if time.Now().After(deadline) {
			t.Fatalf("instance beating for %v after 10 s, want %v", self.BeatingFor(), d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRetiredInstanceStaysRetired: a graceful shutdown retires the process's row while its
// heartbeat may still tick; a beat after that must not take the retired row for one declared
// dead by someone else and register a new row, which nothing would ever retire (and which
// another process would later find dead, and count, and log as a death).
func TestRetiredInstanceStaysRetired(t *testing.T) {
	e := newStoreEnv(t)
	in, err := e.store.RegisterInstance(e.ctx(), "stopping", 10*time.Millisecond, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	id := in.ID()
	if err := in.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	for range 5 { // beats after Retire, by hand as well as by Run's ticker (every 10 ms)
		if err := in.Beat(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	<-done
	rows, err := e.store.ListInstances(e.ctx(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if in.ID() != id || len(rows) != 1 || !rows[0].DeadAt.Valid {
		t.Errorf("after Retire: id %s (was %s), rows %+v; want the one row, retired", in.ID(), id, rows)
	}
}

// TestRetiredInstanceLeasedHoldKeepsItsExpiry: a process shut down while a call's lease still
// lives (its drain cut, the lease not yet lapsed) leaves that hold to its own expiry, neither
// brought in nor extended past it by the scan; once the lease has lapsed the next pass brings
// it in and settles it from its tally.
func TestRetiredInstanceLeasedHoldKeepsItsExpiry(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("u", 3, nil)
	in, err := e.store.RegisterInstance(e.ctx(), "gw", time.Second, 0, e.log)
	if err != nil {
		t.Fatal(err)
	}
	h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_cut", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: 30 * time.Second, ServedBy: in.ID()})
	if err != nil {
		t.Fatal(err)
	}
	orig := e.runAny(h.RunID).ExpiresAt
	l := runstate.NewLeases(e.rdb, e.keys, "gw", time.Minute, time.Second, e.log)
	l.Acquire(h.RunID)
	if err := l.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if err := in.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter = time.Hour; c.ExtendBy = 15 * time.Minute })
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.runAny(h.RunID); got.State != holds.StateRunning || !got.ExpiresAt.Equal(orig) || st.BroughtIn != 0 {
		t.Errorf("leased hold of a retired process: %s expiring %v (was %v), pass %+v; want untouched", got.State, got.ExpiresAt, orig, st)
	}
	e.addTally(h.RunID, pricing.Usage{Input: 40, Output: 4}, 140)
	if err := l.Release(e.ctx(), h.RunID); err != nil {
		t.Fatal(err)
	}
	if st, err := e.pass(rec); err != nil || st.BroughtIn != 1 || st.FromTally != 1 {
		t.Errorf("pass after the lease lapsed: %+v, %v; want the hold brought in and settled from its tally", st, err)
	}
	if r := e.run(u, h.RunID); r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 140 {
		t.Errorf("hold left at shutdown: %q charged %d, want reconcile at 140", r.SettleSource.String, r.ChargedMicro)
	}
}

// TestDeadRowLeasedHoldsDoNotHideItsOthers: a dead row's holds are read by run id, a batch at
// a time, at most MaxBatches a pass. Read from the first each pass, leased holds (a call its
// process, paused or cut off from the database, still serves) that fill a pass kept the
// unleased ones after them from ever being brought in: they waited out their whole hold_ttl,
// their callers' in-flight slots taken. Each pass now reads on from where the last stopped.
func TestDeadRowLeasedHoldsDoNotHideItsOthers(t *testing.T) {
	e := newStoreEnv(t)
	f := newDeadRowBehindLeases(t, e, "hidden-user")
	// One hold a batch, one batch a pass: each leased hold fills a pass.
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Batch, c.MaxBatches = deadBound, 1, 1 })
	for pass := 1; pass <= 8; pass++ {
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	f.check(t, e, "eight passes")
}

// deadRowBehindLeases is a dead process's row whose first holds (by run id) its process still
// leases, and one unleased hold behind them that only a read past them brings in.
type deadRowBehindLeases struct {
	u      holds.User
	in     *holds.Instance
	leased []holds.Hold
	hidden holds.Hold
}

func newDeadRowBehindLeases(t *testing.T, e *storeEnv, user string) deadRowBehindLeases {
	t.Helper()
	f := deadRowBehindLeases{u: e.user(user, 5, nil)}
	leases := runstate.NewLeases(e.rdb, e.keys, "cut-off-process", time.Minute, time.Second, e.log)
	var err error
	if f.in, err = e.store.RegisterInstance(e.ctx(), "cut-off", 50*time.Millisecond, 0, e.log); err != nil {
		t.Fatal(err)
	}
	// Run ids sort the leased holds first.
	for _, id := range []string{"r_a_leased_1", "r_a_leased_2"} {
		h := e.admitBy(f.u, id, "", f.in.ID(), holds.StateRunning)
		leases.Acquire(h.RunID)
		f.leased = append(f.leased, h)
	}
	f.hidden = e.admitBy(f.u, "r_b_unleased", "", f.in.ID(), holds.StateRunning)
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	if err := f.in.Retire(e.ctx()); err != nil {
		t.Fatal(err)
	}
	return f
}

// check says whether the passes (named by after) brought the unleased hold in, left the
// leased ones running, and left the row unswept.
func (f deadRowBehindLeases) check(t *testing.T, e *storeEnv, after string) {
	t.Helper()
	if r := e.run(f.u, f.hidden.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold {
		t.Errorf("unleased call behind the leased ones: %s by %q after %s, want settled at its hold", r.State, r.SettleSource.String, after)
	}
	for _, h := range f.leased {
		if r := e.run(f.u, h.RunID); r.State != holds.StateRunning {
			t.Errorf("leased call %s: %s, want still running (its process serves it)", h.RunID, r.State)
		}
	}
	if row := e.instance(f.in.ID()); row.SweptAt.Valid {
		t.Errorf("row swept at %v with leased holds left", row.SweptAt.Time)
	}
}

// TestDeadRowsLeasedHoldsEachKeepTheirPlace: as TestDeadRowLeasedHoldsDoNotHideItsOthers, with
// two such rows (two processes cut off from the database by one partition). Where each row's
// read stopped is kept for that row: kept in one place for all, each row's stop overwrote the
// other's, both rows were read from their first hold again every other pass, and neither's
// unleased hold was ever brought in.
func TestDeadRowsLeasedHoldsEachKeepTheirPlace(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("hidden-users", 10, nil)
	leases := runstate.NewLeases(e.rdb, e.keys, "cut-off-process", time.Minute, time.Second, e.log)
	var hidden []holds.Hold
	for _, name := range []string{"cut-off-1", "cut-off-2"} {
		in, err := e.store.RegisterInstance(e.ctx(), name, 50*time.Millisecond, 0, e.log)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"r_a_leased_1_" + name, "r_a_leased_2_" + name} {
			leases.Acquire(e.admitBy(u, id, "", in.ID(), holds.StateRunning).RunID)
		}
		hidden = append(hidden, e.admitBy(u, "r_b_unleased_"+name, "", in.ID(), holds.StateRunning))
		if err := in.Retire(e.ctx()); err != nil {
			t.Fatal(err)
		}
	}
	if err := leases.Refresh(e.ctx()); err != nil {
		t.Fatal(err)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.DeadAfter, c.Batch, c.MaxBatches = deadBound, 1, 1 })
	for pass := 1; pass <= 24; pass++ {
		if _, err := e.pass(rec); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	for _, h := range hidden {
		if r := e.run(u, h.RunID); r.State != holds.StateSettled {
			t.Errorf("unleased call %s behind the leased ones: %s after 24 passes, want settled", h.RunID, r.State)
		}
	}
}
