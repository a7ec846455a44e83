package holds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
)

// TestDeadInstanceSweepRefusedByAFullDiskIsTriedAgainUntilThereIsRoom: the reconciler's sweep
// of a dead (here retired) instance brings in the expiry of each hold it left, which changes
// the hold's row in place but moves its expiry, a key of idx_run_holds_state_expires, whose new
// entry must grow the table once its page is full: on a full disk MariaDB refuses it at once,
// 1114 (README Operating it, Full disks). Given up at once, the sweep stopped there and the
// holds it had not reached kept the caller's in-flight slots until the next pass, a reconcile
// period later. Here run_holds lives on a small file system of the test's own (it needs root),
// filled after the runs' admissions, and room is made once a refusal is logged: the pass
// brings in every hold of the instance, each retry logged with its run id.
func TestDeadInstanceSweepRefusedByAFullDiskIsTriedAgainUntilThereIsRoom(t *testing.T) {
	f := newFullDiskFixture(t)
	ctx := context.Background()
	const runs = 600
	if _, err := f.db.Exec("UPDATE users SET max_in_flight = ?, allowance_micro = ? WHERE id = ?", runs, int64(1)<<50, f.user.ID); err != nil {
		t.Fatal(err)
	}
	in, err := f.store.RegisterInstance(ctx, "stopping", time.Second, 0, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: fmt.Sprintf("r_full_dead_%04d", i), UserID: f.user.ID,
			State: holds.StateRunning, TTL: 15 * time.Minute, ServedBy: in.ID()}); err != nil {
			t.Fatal(err)
		}
	}
	// A beat after the admissions: every hold was admitted while the instance was alive. Not
	// by moving the holds' created_at back, as other sweep tests do: that changes a key of
	// idx_run_holds_created, whose old entries InnoDB's purge frees at a moment of its own,
	// and pages it had freed before the sweep gave the sweep's new index entries room on the
	// full disk (the refusal this test needs was then never seen).
	if err := in.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := in.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	f.fill()
	core, recLogs := observer.New(zapcore.WarnLevel)
	rec := holds.NewReconciler(holds.ReconcilerConfig{
		Store: f.store, Usage: failingUsage{}, Leases: noneLeased{}, Lock: heldLock{},
		Log: zap.New(core), ExtendBy: time.Hour, Interval: time.Second, Batch: 1000,
		PassBudget: time.Minute, DeadAfter: time.Hour,
	})
	type result struct {
		st  holds.Stats
		err error
	}
	out := make(chan result, 1)
	go func() {
		st, err := rec.RunOnce(ctx)
		out <- result{st, err}
	}()
	r, seen := awaitRefusal(f.logs, out, f.free)
	var live int
	if err := f.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE served_by = ? AND state IN ('queued', 'running') AND expires_at > NOW(6)",
		in.ID()); err != nil {
		t.Fatal(err)
	}
	if !seen {
		if recLogs.Filter(refusedFull).Len() > 0 {
			t.Fatalf("a bringing in refused by a full disk, not tried again: %+v, %d left live: %v", r.st, live,
				recLogs.Filter(refusedFull).All()[0].ContextMap()["error"])
		}
		t.Fatalf("no bringing in was refused for a full table: the test proves nothing (%+v, %v, %d left live)", r.st, r.err, live)
	}
	if r.st.BroughtIn != runs || live != 0 {
		t.Fatalf("pass in which the sweep was refused by a full disk until room was made: %+v, %v, %d left live; want all %d brought in",
			r.st, r.err, live, runs)
	}
	for _, e := range f.logs.Filter(refusedFull).All() {
		if e.Message != "database disk full, retrying" || e.ContextMap()["run_id"] == nil {
			t.Errorf("retry logged without its run id: %q %v", e.Message, e.ContextMap())
		}
	}
	var left []string
	if err := f.db.Select(&left, "SELECT run_id FROM run_holds WHERE user_id = ? AND state IN ('queued', 'running')", f.user.ID); err != nil {
		t.Fatal(err)
	}
	for _, run := range left {
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}

// noneLeased says no run is served by a live process.
type noneLeased struct{}

func (noneLeased) Exists(context.Context, string) (bool, error) { return false, nil }
