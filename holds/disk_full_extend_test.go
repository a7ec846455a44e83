package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcilerExtendRefusedByAFullDiskIsTriedAgainUntilThereIsRoom: the reconciler's
// extension of a hold a call outlives (its lease still held) changes the run's row in place,
// but moves its expiry, a key of idx_run_holds_state_expires, whose new entry must grow the
// table once its page is full: on a full disk MariaDB refuses it at once, 1114 (README
// Operating it, Full disks). Given up at once, the hold failed the pass and stayed expired
// until the next one, a reconcile period later, the user's in-flight count leaving the running
// call out meanwhile. Here run_holds lives on a small file system of the test's own (it needs
// root), filled after the runs' admissions; every run is expired and leased, so one pass
// extends them all, and room is made once a refusal is logged: the extension lands within the
// hold's time in the pass, and the pass extends every hold with no error.
func TestReconcilerExtendRefusedByAFullDiskIsTriedAgainUntilThereIsRoom(t *testing.T) {
	f := newFullDiskFixture(t)
	const runs = 600
	if _, err := f.db.Exec("UPDATE users SET max_in_flight = ?, allowance_micro = ? WHERE id = ?", runs, int64(1)<<50, f.user.ID); err != nil {
		t.Fatal(err)
	}
	// The calls outlive their holds: every hold runs out a microsecond after its admission,
	// every run is still leased. Not by moving the holds' expiry back after the admissions:
	// that changes a key of idx_run_holds_state_expires, whose old entries InnoDB's purge frees
	// at a moment of its own, and pages it had freed before the pass gave the extensions' new
	// index entries room on the full disk (the refusal this test needs was then never seen).
	for i := range runs {
		if _, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: fmt.Sprintf("r_full_extend_%04d", i),
			UserID: f.user.ID, State: holds.StateRunning, TTL: time.Microsecond}); err != nil {
			t.Fatal(err)
		}
	}
	f.fill()
	rec := holds.NewReconciler(holds.ReconcilerConfig{
		Store: f.store, Usage: failingUsage{}, Leases: allLeased{}, Lock: heldLock{},
		Log: zap.NewNop(), ExtendBy: time.Hour, Interval: time.Second, Batch: 1000,
		PassBudget: time.Minute,
	})
	type result struct {
		st  holds.Stats
		err error
	}
	out := make(chan result, 1)
	go func() {
		st, err := rec.RunOnce(context.Background())
		out <- result{st, err}
	}()
	r, seen := awaitRefusal(f.logs, out, f.free)
	if !seen {
		if r.err != nil && strings.Contains(r.err.Error(), "1114") {
			t.Fatalf("an extension refused by a full disk, not tried again: %+v, %v", r.st, r.err)
		}
		t.Fatalf("no extension was refused for a full table: the test proves nothing (%+v, %v)", r.st, r.err)
	}
	if r.err != nil || r.st.Extended != runs || r.st.Errors != 0 {
		t.Fatalf("pass in which an extension was refused by a full disk until room was made: %+v, %v; want all %d extended, no error",
			r.st, r.err, runs)
	}
	for _, e := range f.logs.Filter(refusedFull).All() {
		if e.Message != "database disk full, retrying" || e.ContextMap()["run_id"] == nil {
			t.Errorf("retry logged without its run id: %q %v", e.Message, e.ContextMap())
		}
	}
	var expired int
	if err := f.db.Get(&expired, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND expires_at < NOW(6) + INTERVAL 50 MINUTE", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if expired != 0 {
		t.Errorf("%d holds not pushed out by the hold TTL (1h) after the pass", expired)
	}
	for i := range runs {
		if _, err := f.store.Settle(context.Background(), holds.Settlement{RunID: fmt.Sprintf("r_full_extend_%04d", i),
			Source: holds.SourceRelease}); err != nil {
			t.Fatal(err)
		}
	}
}

// allLeased says every run is still served by a live process.
type allLeased struct{}

func (allLeased) Exists(context.Context, string) (bool, error) { return true, nil }

// heldLock is a reconcile lock this process always wins.
type heldLock struct{}

func (heldLock) TryLock(context.Context) (bool, error) { return true, nil }
