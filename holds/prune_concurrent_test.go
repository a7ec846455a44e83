package holds_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestTwoPrunesAtOnceMoveEachRunOnce: two prunes (two operators, or a cron beside a manual
// run) start on the same old runs at once. Each batch locks the rows it reads, so the second
// waits for the first and then finds them gone: both succeed and every run is summed into
// pruned_runs once. Read without the lock, both summed the same rows and the second then
// deleted none of them, failing after the work of a whole batch.
func TestTwoPrunesAtOnceMoveEachRunOnce(t *testing.T) {
	f := newAcctFixture(t)
	const runs = 6
	u := f.user("pruned_twice", "standard")
	var charged int64
	for i := range runs {
		id := fmt.Sprintf("r_twice_%d", i)
		f.admit(u, id)
		charged += f.settle(id, int64(1_000+i)).ChargedMicro
	}
	f.ageRuns(u, 10)

	// One run's row locked by someone else makes both prunes wait at once, wherever each
	// takes its locks; both are under way before it is let go.
	hold := testenv.ConsoleTx(t, f.db)
	if _, err := hold.ExecContext(f.ctx(), "SELECT run_id FROM run_holds WHERE run_id = 'r_twice_0' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// A connection of its own to watch for the prunes' lock waits.
	obs, err := f.db.Connx(f.ctx())
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	var wg sync.WaitGroup
	results := make([]holds.PruneResult, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f.store.PruneSettled(f.ctx(), holds.MinPruneAge, runs)
		}()
	}
	waitLockWaits(t, obs, 2)
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("prune %d beside another: %v", i+1, err)
		}
	}
	if moved := results[0].Runs + results[1].Runs; moved != runs {
		t.Errorf("the two prunes moved %d and %d runs, want %d in all", results[0].Runs, results[1].Runs, runs)
	}
	var p struct {
		Runs    int64 `db:"runs"`
		Charged int64 `db:"charged"`
	}
	if err := f.db.GetContext(f.ctx(), &p, "SELECT COALESCE(SUM(runs), 0) AS runs, COALESCE(SUM(charged_micro), 0) AS charged FROM pruned_runs"); err != nil {
		t.Fatal(err)
	}
	if p.Runs != runs || p.Charged != charged {
		t.Errorf("pruned_runs sums %d runs charged %d, want %d runs charged %d", p.Runs, p.Charged, runs, charged)
	}
}
