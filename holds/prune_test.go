package holds_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// ageRuns moves a user's settled runs and day ledger back days days, together, as if they had
// settled then (the data moves, not the database's clock). Every settled run of the user must be
// among them, since the ledger rows move whole.
func (f *acctFixture) ageRuns(u holds.User, days int) {
	f.t.Helper()
	if _, err := f.db.ExecContext(f.ctx(), `UPDATE run_holds SET settled_at = settled_at - INTERVAL ? DAY,
		created_at = created_at - INTERVAL ? DAY WHERE user_id = ? AND state = 'settled'`, days, days, u.ID); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE usage_days SET day = day - INTERVAL ? DAY WHERE user_id = ?", days, u.ID); err != nil {
		f.t.Fatal(err)
	}
}

// TestPruneKeepsTheBooksAndTheReport: without a prune, a run_holds row per call is kept for
// good; an operator's own DELETE of old rows broke `gateway audit` (the day ledger and the
// prepaid credits no longer equal what the runs left say) and shrank the usage report of
// those days. PruneSettled deletes settled runs older than its cutoff, batch by batch, and the
// audit, each user's balance and the usage report over the pruned days read as before. Live
// runs and younger settled ones stay; a pruned run is not found; a second prune finds nothing.
func TestPruneKeepsTheBooksAndTheReport(t *testing.T) {
	f := newAcctFixture(t)
	a, b := f.user("alpha", "standard"), f.user("beta", "guest")
	f.grant(b, 200_000, "b-topup")
	// Runs charged an estimate: the report counts them, before a prune and after.
	estimated := map[string]bool{"r_a3": true, "r_b4": true, "r_b3": true}
	settle := func(u holds.User, id, model string, cost int64) {
		t.Helper()
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: cost, Calls: 2,
			Usage: pricingUsage(cost), Source: holds.SourceComplete, Estimated: estimated[id]}); err != nil {
			t.Fatal(err)
		}
	}
	settle(a, "r_a1", "gpt-a", 1_234)
	settle(a, "r_a2", "gpt-a", 0) // a release: a run, not a charged one
	settle(a, "r_a3", "gpt-b", 5_000)
	settle(b, "r_b1", "gpt-a", 40_000)
	settle(b, "r_b2", "gpt-a", 50_000) // guest: 25 % off
	settle(b, "r_b4", "gpt-a", 50_000) // past the guest's allowance: partly from prepaid
	if _, err := f.store.ClaimSession(f.ctx(), a.ID, "conv", "r_a3", sha256.Sum256([]byte("hello"))); err != nil {
		t.Fatal(err)
	}
	f.ageRuns(a, 10)
	f.ageRuns(b, 10)
	settle(b, "r_b3", "gpt-a", 3_000) // today: kept
	f.admit(a, "r_live")              // live, however old: kept
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET created_at = created_at - INTERVAL 30 DAY WHERE run_id = 'r_live'"); err != nil {
		t.Fatal(err)
	}

	var today time.Time
	if err := f.db.GetContext(f.ctx(), &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		t.Fatal(err)
	}
	report := func() holds.UsageReport {
		t.Helper()
		rep, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -12), today, 0)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	balances := func() [2]holds.Balance {
		t.Helper()
		var out [2]holds.Balance
		for i, u := range []holds.User{a, b} {
			var err error
			if out[i], err = f.store.Balance(f.ctx(), u.ID); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	before, balBefore := report(), balances()
	if len(before.Rows) != 4 || before.Totals.Runs != 7 || before.Totals.PrepaidPartMicro == 0 || before.Totals.EstimatedRuns != 3 {
		t.Fatalf("report before the prune: %+v; want 4 rows of 7 runs, 3 estimated, some paid from prepaid", before)
	}
	// The parts of the token totals a provider's invoice lists apart are in the report, and a
	// prune must keep them with the totals.
	var parts pricing.Usage
	for _, c := range []int64{1_234, 0, 5_000, 40_000, 50_000, 50_000, 3_000} {
		parts = parts.Add(pricingUsage(c))
	}
	if got := before.Totals; got.CacheWrite1hTok != parts.CacheWrite1h || got.AudioInTok != parts.AudioInput ||
		got.AudioOutTok != parts.AudioOutput || parts.CacheWrite1h == 0 || parts.AudioOutput == 0 {
		t.Fatalf("report before the prune: one-hour writes %d, audio in %d, audio out %d; want %+v",
			got.CacheWrite1hTok, got.AudioInTok, got.AudioOutTok, parts)
	}

	res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 6 || res.Batches != 3 {
		t.Errorf("pruned %+v, want 6 runs in 3 batches of at most 2", res)
	}
	if after := report(); !reflect.DeepEqual(after, before) {
		t.Errorf("usage report changed by the prune:\nbefore %+v\nafter  %+v", before, after)
	}
	if bal := balances(); bal != balBefore {
		t.Errorf("balances changed by the prune: before %+v, after %+v", balBefore, bal)
	}
	var left []string
	if err := f.db.SelectContext(f.ctx(), &left, "SELECT run_id FROM run_holds ORDER BY run_id"); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(left, []string{"r_b3", "r_live"}) {
		t.Errorf("runs left %v, want r_b3 (settled today) and r_live (live)", left)
	}
	if _, err := f.store.Run(f.ctx(), a.ID, "r_a1"); !errors.Is(err, holds.ErrRunNotFound) {
		t.Errorf("a pruned run read back: %v, want ErrRunNotFound", err)
	}
	// The session whose run was pruned is pruned once idle, as one whose run settled is.
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE sessions SET updated_at = NOW(6) - INTERVAL 1 HOUR"); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.PruneSessions(f.ctx(), time.Minute, 100); err != nil || n != 1 {
		t.Errorf("sessions pruned: %d, %v; want the one whose run was pruned", n, err)
	}
	if res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 2); err != nil || res.Runs != 0 {
		t.Errorf("second prune: %+v, %v; want nothing left to prune", res, err)
	}
	// The audit (testenv.CheckLedger at cleanup) adds pruned_runs in: without it, alpha's and
	// beta's pruned days and beta's prepaid credits would be mismatches.
}

// TestPruneRefusesATooYoungCutoffOrABadBatch: a cutoff under MinPruneAge could delete a run an
// Idempotency-Key replay or a session still names; a batch out of bounds is an unbounded
// transaction or none. Nothing is deleted.
func TestPruneRefusesATooYoungCutoffOrABadBatch(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("alpha", "standard")
	f.admit(u, "r_1")
	f.settle("r_1", 1_000)
	f.ageRuns(u, 30)
	for _, tc := range []struct {
		age   time.Duration
		batch int
	}{{holds.MinPruneAge - time.Second, 100}, {holds.MinPruneAge, 0}, {holds.MinPruneAge, holds.MaxPruneBatch + 1}} {
		if res, err := f.store.PruneSettled(f.ctx(), tc.age, tc.batch); !errors.Is(err, holds.ErrBadFilter) || res.Runs != 0 {
			t.Errorf("prune older than %v in batches of %d: %+v, %v; want ErrBadFilter", tc.age, tc.batch, res, err)
		}
	}
	if _, err := f.store.Run(f.ctx(), u.ID, "r_1"); err != nil {
		t.Errorf("run after refused prunes: %v", err)
	}
}

// TestPruneBesideSettlementsKeepsTheBooks: a prune runs while the same users' calls are
// admitted and settled and late duplicate settlements of the runs being pruned arrive (a
// settlement locks its user, then the run; the prune locks old settled runs and no user).
// Nothing deadlocks or fails, every old run is pruned exactly once (the sums in pruned_runs
// count each once), no duplicate settlement charges again, and the books balance.
func TestPruneBesideSettlementsKeepsTheBooks(t *testing.T) {
	f := newAcctFixture(t)
	const users, old, fresh = 4, 60, 40
	us := make([]holds.User, users)
	for i := range us {
		us[i] = f.user(fmt.Sprintf("u%d", i), "standard")
		if err := f.store.SetUserLimits(f.ctx(), us[i].ID, nil, ptr(100), nil); err != nil {
			t.Fatal(err)
		}
		f.grant(us[i], 50_000, fmt.Sprintf("topup-%d", i))
		for j := range old {
			id := fmt.Sprintf("r_old_%d_%d", i, j)
			f.admit(us[i], id)
			f.settle(id, int64(1_000+j))
		}
		f.ageRuns(us[i], 10)
	}
	var charged int64
	if err := f.db.GetContext(f.ctx(), &charged, "SELECT SUM(charged_micro) FROM run_holds"); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, users*2+1)
	for i, u := range us {
		wg.Add(2)
		go func() { // this user's new calls
			defer wg.Done()
			for j := range fresh {
				id := fmt.Sprintf("r_new_%d_%d", i, j)
				if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "fake-gpt",
					State: holds.StateRunning, TTL: time.Minute}); err != nil {
					errs <- err
					return
				}
				if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: 500, Calls: 1, Source: holds.SourceComplete}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // late duplicates of its old runs: already settled, or pruned
			defer wg.Done()
			for j := range old {
				out, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: fmt.Sprintf("r_old_%d_%d", i, j), UserID: u.ID,
					CostMicro: 9_999, Calls: 1, Source: holds.SourceComplete})
				if err != nil && !errors.Is(err, holds.ErrRunNotFound) {
					errs <- err
					return
				}
				if err == nil && out.Applied {
					errs <- fmt.Errorf("a duplicate settlement of r_old_%d_%d was applied: %+v", i, j, out)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 7); err != nil {
			errs <- err
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	var p struct {
		Runs    int64 `db:"runs"`
		Charged int64 `db:"charged"`
	}
	if err := f.db.GetContext(f.ctx(), &p, "SELECT COALESCE(SUM(runs), 0) AS runs, COALESCE(SUM(charged_micro), 0) AS charged FROM pruned_runs"); err != nil {
		t.Fatal(err)
	}
	if p.Runs != users*old || p.Charged != charged {
		t.Errorf("pruned_runs sums %d runs charged %d, want the %d old runs charged %d", p.Runs, p.Charged, users*old, charged)
	}
	var oldLeft int
	if err := f.db.GetContext(f.ctx(), &oldLeft, "SELECT COUNT(*) FROM run_holds WHERE run_id LIKE 'r\\_old\\_%'"); err != nil || oldLeft != 0 {
		t.Errorf("%d old runs left, %v", oldLeft, err)
	}
	// testenv.CheckLedger at cleanup: the day ledgers and prepaid credits against runs and sums.
}

// TestReportAndAuditDuringAPruneReadTheSame: a prune moves runs into pruned_runs batch by
// batch while an operator reads. Every usage report taken meanwhile must show the totals of
// before (one snapshot: a batch is seen wholly moved or wholly in place, never in both places
// or in neither) and agree with the day ledger, and the audit must find nothing.
func TestReportAndAuditDuringAPruneReadTheSame(t *testing.T) {
	f := newAcctFixture(t)
	for i := range 3 {
		u := f.user(fmt.Sprintf("p%d", i), []string{"standard", "guest"}[i%2])
		f.grant(u, 500_000, fmt.Sprintf("g%d", i))
		for j := range 30 {
			id := fmt.Sprintf("r_p_%d_%d", i, j)
			if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: fmt.Sprintf("m%d", j%3), State: holds.StateRunning, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			f.settle(id, int64(3_000+j*100))
		}
		f.ageRuns(u, 10)
	}
	var today time.Time
	if err := f.db.GetContext(f.ctx(), &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		t.Fatal(err)
	}
	before, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -12), today, 0)
	if err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer done.Store(true)
		if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 1); err != nil {
			t.Error(err)
		}
	}()
	go func() {
		defer wg.Done()
		for first := true; first || !done.Load(); first = false {
			rep, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -12), today, 0)
			if err != nil {
				t.Error(err)
				return
			}
			if !reflect.DeepEqual(rep.Totals, before.Totals) || rep.LedgerMicro != before.LedgerMicro {
				t.Errorf("report during prune: %+v want %+v", rep.Totals, before.Totals)
				return
			}
			bad, err := holds.Audit(f.ctx(), f.db)
			if err != nil || len(bad) > 0 {
				t.Errorf("audit during prune: %v %v", bad, err)
				return
			}
		}
	}()
	wg.Wait()
}
