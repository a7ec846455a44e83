package holds_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// settleAs admits and settles one run of u under model at cost (0: a call the provider refused,
// which reports no usage).
func (f *acctFixture) settleAs(u holds.User, id, model string, cost int64) {
	f.t.Helper()
	var usage pricing.Usage
	if cost > 0 {
		usage = pricingUsage(cost)
	}
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning, TTL: time.Minute}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: cost, Calls: 1, Usage: usage,
		Source: holds.SourceComplete}); err != nil {
		f.t.Fatal(err)
	}
}

// prunedModels is how many pruned_runs rows u has.
func (f *acctFixture) prunedModels(u holds.User) int {
	f.t.Helper()
	var n int
	if err := f.db.GetContext(f.ctx(), &n, "SELECT COUNT(*) FROM pruned_runs WHERE user_id = ?", u.ID); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// lastDaysUsage is u's usage report of the last 12 days by the database's clock: the days
// these tests' runs are aged into, and today.
func (f *acctFixture) lastDaysUsage(u holds.User) holds.UsageReport {
	f.t.Helper()
	var today time.Time
	if err := f.db.GetContext(f.ctx(), &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		f.t.Fatal(err)
	}
	rep, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -12), today, u.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	return rep
}

// TestPruneBoundsTheModelsOfAUserDay: prices match by prefix, so a caller can send endless
// distinct names ("gpt-4o-<random>") that are priced and admitted; the provider refuses each,
// and it settles at 0. pruned_runs kept a row per user, day and model as sent, so each name
// stayed a row for good after the prune: the table grew with the names a hostile or buggy
// caller sent, and a prune did not shrink what they left. Now a user's day keeps at most
// MaxPrunedModels models; the rest of its runs are added into one row under the empty model
// name, which no caller can send, and every total of the report stays exact.
func TestPruneBoundsTheModelsOfAUserDay(t *testing.T) {
	f := newAcctFixture(t)
	const names = holds.MaxPrunedModels + 30
	u := f.user("many-names", "standard")
	f.settleAs(u, "r_real_1", "gpt-4o", 12_000)
	for i := range names {
		f.settleAs(u, fmt.Sprintf("r_junk_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 0)
	}
	f.settleAs(u, "r_real_2", "gpt-4o", 8_000)
	f.settleAs(u, "r_real_3", "gpt-4o-mini", 3_000) // first met past the bound: takes a refused name's place
	f.ageRuns(u, 10)

	before := f.lastDaysUsage(u)
	// Batches smaller than the names, so the bound is kept across them.
	res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 17)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != names+3 {
		t.Errorf("pruned %+v, want %d runs", res, names+3)
	}
	if n := f.prunedModels(u); n > holds.MaxPrunedModels+1 {
		t.Errorf("%d pruned_runs rows for one user and day of %d model names; want at most %d (the bound and the rest)",
			n, names+2, holds.MaxPrunedModels+1)
	}
	after := f.lastDaysUsage(u)
	if !reflect.DeepEqual(after.Totals, before.Totals) || after.LedgerMicro != before.LedgerMicro ||
		after.Totals.ChargedMicro != after.LedgerMicro || after.Totals.ChargedRuns != after.LedgerRuns {
		t.Errorf("report totals changed by the prune:\nbefore %+v (ledger %d)\nafter  %+v (ledger %d)",
			before.Totals, before.LedgerMicro, after.Totals, after.LedgerMicro)
	}
	// The model the user was charged for first keeps its own row, whole.
	for _, r := range after.Rows {
		if r.Model == "gpt-4o" && (r.Runs != 2 || r.ChargedRuns != 2) {
			t.Errorf("gpt-4o after the prune: %+v; want its 2 charged runs in its own row", r)
		}
	}
	// A second prune finds nothing; the audit (CheckLedger at cleanup) balances.
	if res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 17); err != nil || res.Runs != 0 {
		t.Errorf("second prune: %+v, %v", res, err)
	}
}

// TestTwoPrunesAtOnceKeepTheModelBound: two prunes at once, in small batches, over days past
// MaxPrunedModels, while late duplicate settlements of the runs arrive. A batch counts a day's
// models after its locking read of the oldest runs, which the other prune's batch waits for, so
// the two cannot both open a day's last free places: nothing fails, every run is summed once,
// and no day holds more rows than the bound and its folded row.
func TestTwoPrunesAtOnceKeepTheModelBound(t *testing.T) {
	f := newAcctFixture(t)
	const names = holds.MaxPrunedModels + 20
	us := []holds.User{f.user("names-a", "standard"), f.user("names-b", "standard")}
	for i, u := range us {
		for j := range names {
			f.settleAs(u, fmt.Sprintf("r_n_%d_%d", i, j), fmt.Sprintf("gpt-4o-%d", j), int64(j%3)*1_000)
		}
		f.ageRuns(u, 10)
	}
	var want struct {
		Runs    int64 `db:"runs"`
		Charged int64 `db:"charged"`
		Tokens  int64 `db:"tokens"`
	}
	const sums = "COALESCE(SUM(charged_micro), 0) AS charged, COALESCE(SUM(in_tok + out_tok), 0) AS tokens"
	if err := f.db.GetContext(f.ctx(), &want, "SELECT COUNT(*) AS runs, "+sums+" FROM run_holds"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 13); err != nil {
				errs <- err
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := range names {
			out, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: fmt.Sprintf("r_n_0_%d", j), UserID: us[0].ID,
				CostMicro: 9_999, Calls: 1, Source: holds.SourceComplete})
			if err != nil && !errors.Is(err, holds.ErrRunNotFound) {
				errs <- err
				return
			}
			if err == nil && out.Applied {
				errs <- fmt.Errorf("a duplicate settlement of r_n_0_%d was applied: %+v", j, out)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var got struct {
		Runs    int64 `db:"runs"`
		Charged int64 `db:"charged"`
		Tokens  int64 `db:"tokens"`
	}
	if err := f.db.GetContext(f.ctx(), &got, "SELECT COALESCE(SUM(runs), 0) AS runs, "+sums+" FROM pruned_runs"); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("pruned_runs sums %+v, want the runs' %+v", got, want)
	}
	for _, u := range us {
		if n := f.prunedModels(u); n != holds.MaxPrunedModels+1 {
			t.Errorf("user %s: %d pruned_runs rows, want the bound and the folded row, %d", u.Name, n, holds.MaxPrunedModels+1)
		}
	}
	// testenv.CheckLedger at cleanup: the day ledgers and prepaid credits against the sums.
}

// TestPruneGivesAChargedModelThePlaceOfOneThatUsedNothing: a day's first MaxPrunedModels names,
// pruned first, were refused names settled at 0, and the model the user was then charged for
// came too late for a row of its own: its cost and tokens were summed under the empty model
// with the refused ones, and the report of the pruned day no longer told the provider's
// invoice by model. A model that used something now takes the place of one that used nothing,
// which is folded instead.
func TestPruneGivesAChargedModelThePlaceOfOneThatUsedNothing(t *testing.T) {
	f := newAcctFixture(t)
	const names = holds.MaxPrunedModels + 10
	u := f.user("junk-first", "standard")
	for i := range names {
		f.settleAs(u, fmt.Sprintf("r_junk_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 0)
	}
	f.settleAs(u, "r_real_1", "gpt-4o", 12_000)
	f.settleAs(u, "r_real_2", "gpt-4o-mini", 3_000)
	f.settleAs(u, "r_real_3", "gpt-4o", 8_000)
	f.ageRuns(u, 10)
	before := f.lastDaysUsage(u)
	// Batches of 11: the refused names fill the day's places before the charged runs come.
	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 11); err != nil {
		t.Fatal(err)
	}
	after := f.lastDaysUsage(u)
	if !reflect.DeepEqual(after.Totals, before.Totals) || after.Totals.ChargedMicro != after.LedgerMicro {
		t.Errorf("report totals changed by the prune:\nbefore %+v\nafter  %+v (ledger %d)", before.Totals, after.Totals, after.LedgerMicro)
	}
	if n := f.prunedModels(u); n != holds.MaxPrunedModels+1 {
		t.Errorf("%d pruned_runs rows, want the bound and the folded row, %d", n, holds.MaxPrunedModels+1)
	}
	want := map[string]holds.UsageRow{}
	for _, r := range before.Rows {
		if r.Model == "gpt-4o" || r.Model == "gpt-4o-mini" {
			want[r.Model] = r
		}
	}
	for _, r := range after.Rows {
		if w, ok := want[r.Model]; ok {
			if r != w {
				t.Errorf("%s after the prune: %+v, want its runs' %+v", r.Model, r, w)
			}
			delete(want, r.Model)
		}
		if r.Model == holds.FoldedModel && (r.ChargedMicro != 0 || r.CostMicro != 0 || r.InTok != 0) {
			t.Errorf("the folded row carries charges or tokens: %+v; only refused names were past the bound", r)
		}
	}
	for m := range want {
		t.Errorf("model %s has no row of its own after the prune", m)
	}
}
