package holds_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneRefusedByAFullDiskIsTriedAgainUntilThereIsRoom: a prune batch adds its runs into
// pruned_runs before it deletes them, and a new user's day and model is a new row, which must
// grow the table once its page is full: on a full disk MariaDB refuses it at once, 1114 (README
// Operating it, Full disks), and the batch's transaction is rolled back whole, nothing of it
// committed. Given up at once, `gateway prune` failed for a disk an operator frees in a
// minute, as its writes refused read_only are not. Here run_holds and pruned_runs live on a
// small file system of the test's own (it needs root), filled after the runs settled, and room
// is made once a refusal is logged: the prune then moves every run into pruned_runs, once, and
// the audit (the fixture's cleanup) reads the books as before.
func TestPruneRefusedByAFullDiskIsTriedAgainUntilThereIsRoom(t *testing.T) {
	f := newFullDiskFixture(t)
	testenv.TableOn(t, f.db, "pruned_runs", filepath.Dir(f.filler))
	ctx := context.Background()
	const runs = holds.MaxPrunedModels
	if _, err := f.db.Exec("UPDATE users SET max_in_flight = ?, allowance_micro = ? WHERE id = ?", runs, int64(1)<<50, f.user.ID); err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		run := fmt.Sprintf("r_full_prune_%04d", i)
		f.admit(run)
		// A model of its own each (a long name: a row of pruned_runs each, pages of them).
		model := fmt.Sprintf("model-%04d-", i) + strings.Repeat("x", 100)
		if _, err := f.store.Settle(ctx, holds.Settlement{RunID: run, UserID: f.user.ID, CostMicro: 1_000, Calls: 1, Model: model,
			Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	// Settled ten days ago, the day ledger with them.
	if _, err := f.db.Exec(`UPDATE run_holds SET settled_at = settled_at - INTERVAL 10 DAY, created_at = created_at - INTERVAL 10 DAY
		WHERE user_id = ?`, f.user.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec("UPDATE usage_days SET day = day - INTERVAL 10 DAY WHERE user_id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	f.fill()
	type result struct {
		res holds.PruneResult
		err error
	}
	out := make(chan result, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := f.store.PruneSettled(pctx, holds.MinPruneAge, holds.MaxPruneBatch)
		out <- result{res, err}
	}()
	r, seen := awaitRefusal(f.logs, out, f.free)
	if !seen {
		if r.err != nil && strings.Contains(r.err.Error(), "1114") {
			t.Fatalf("a prune refused by a full disk, not tried again: %+v, %v", r.res, r.err)
		}
		t.Fatalf("no prune batch was refused for a full table: the test proves nothing (%+v, %v)", r.res, r.err)
	}
	if r.err != nil || r.res.Runs != runs || r.res.Batches != 1 {
		t.Fatalf("prune refused by a full disk until room was made: %+v, %v; want all %d runs pruned in one batch", r.res, r.err, runs)
	}
	for _, e := range f.logs.Filter(refusedFull).All() {
		if e.Message != "database disk full, retrying" || e.ContextMap()["op"] != "prune" {
			t.Errorf("retry logged without its operation: %q %v", e.Message, e.ContextMap())
		}
	}
	var left, rows, summed int
	if err := f.db.Get(&left, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Get(&rows, "SELECT COUNT(*) FROM pruned_runs WHERE user_id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Get(&summed, "SELECT COALESCE(SUM(runs), 0) FROM pruned_runs WHERE user_id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	if left != 0 || rows != runs || summed != runs {
		t.Errorf("after the prune: %d runs left, %d pruned_runs rows summing %d runs; want none left, %d rows of one run each", left, rows, summed, runs)
	}
}
