package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestPruneBatchDoesNotHoldUpItsUsersCalls: `gateway prune` on a backlog of months deletes
// millions of rows. Each batch is one transaction that locks at most its batch of old settled
// rows and no user row, so the same user's admissions, settlements and grants (which lock the
// user, then live rows) go on while a batch holds its locks, and the backlog commits batch by
// batch. A prune batch is held here mid-way, waiting for a row another transaction locked (as
// a slow disk or a late duplicate settlement would hold it), while the user's calls are
// admitted and settled and a grant lands: each must complete while the batch still waits with
// its rows locked (one that waited for the batch would wait for the blocker too, and fail at
// its lock wait timeouts); then the prune ends in ceil(runs/batch) commits.
func TestPruneBatchDoesNotHoldUpItsUsersCalls(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	u := f.user("pruned-while-calling", "standard")
	f.grant(u, 100_000, "before-prune")
	const runs, batch = 120, 50
	old := time.Now().UTC().AddDate(0, 0, -30)
	var q strings.Builder
	var args []any
	q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at, created_at, settled_at, settle_source) VALUES `)
	for i := range runs {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString("(?, ?, 'settled', 0, 0, 'fake-gpt', ?, ?, ?, 'release')")
		at := old.Add(time.Duration(i) * time.Second)
		args = append(args, fmt.Sprintf("r_prune_old_%03d", i), u.ID, at, at, at)
	}
	if _, err := f.db.ExecContext(ctx, q.String(), args...); err != nil {
		t.Fatal(err)
	}
	// Another transaction holds the 30th oldest run: the first batch locks the 29 before it and waits.
	blocker := testenv.ConsoleTx(t, f.db)
	if _, err := blocker.ExecContext(ctx, "SELECT run_id FROM run_holds WHERE run_id = 'r_prune_old_029' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	obs, err := f.db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	type pruned struct {
		res holds.PruneResult
		err error
	}
	done := make(chan pruned, 1)
	go func() {
		res, err := f.store.PruneSettled(context.Background(), holds.MinPruneAge, batch)
		done <- pruned{res, err}
	}()
	waitLockWaits(t, obs, 1)

	for i := range 3 {
		id := fmt.Sprintf("r_prune_new_%d", i)
		f.admit(u, id)
		f.settle(id, 1_500)
	}
	f.grant(u, 5_000, "during-prune")
	if r, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_prune_old_100", UserID: u.ID, CostMicro: 9_999, Calls: 1,
		Source: holds.SourceComplete}); err != nil || r.Applied {
		t.Fatalf("a late duplicate settlement of an old run the batch has not reached: %+v, %v; want it found settled", r, err)
	}
	// The batch is still there, waiting, with its rows locked: the calls ran beside it. (Its
	// wait ends at the store's lock wait timeout and is tried again, taking the same locks.)
	waitLockWaits(t, obs, 1)
	var locked []int64
	if err := obs.SelectContext(ctx, &locked, `SELECT t.trx_rows_locked FROM information_schema.innodb_trx t
		JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
		WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()`); err != nil {
		t.Fatal(err)
	}
	if len(locked) != 1 || locked[0] == 0 || locked[0] > 2*batch {
		t.Fatalf("the waiting prune batch holds %v row locks, want one transaction with some and at most its batch's rows and their index entries", locked)
	}
	if err := blocker.Rollback(); err != nil {
		t.Fatal(err)
	}
	p := <-done
	if p.err != nil {
		t.Fatal(p.err)
	}
	if want := (runs + batch - 1) / batch; p.res.Runs != runs || p.res.Batches != want {
		t.Fatalf("prune: %+v, want %d runs in %d batches of at most %d", p.res, runs, want, batch)
	}
}
