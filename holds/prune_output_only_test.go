package holds_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// settleOutputOnly admits and settles one run of u under model that the provider answered with
// output tokens alone, at no cost (a free model): it used something, so it is no refused name.
func (f *acctFixture) settleOutputOnly(u holds.User, id, model string) {
	f.t.Helper()
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning, TTL: time.Minute}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, Calls: 1, Usage: pricing.Usage{Output: 40},
		Source: holds.SourceComplete}); err != nil {
		f.t.Fatal(err)
	}
}

// prunedRuns is u's pruned_runs rows: runs by model.
func (f *acctFixture) prunedRuns(u holds.User) map[string]int64 {
	f.t.Helper()
	var rows []struct {
		Model string `db:"model"`
		Runs  int64  `db:"runs"`
	}
	if err := f.db.SelectContext(f.ctx(), &rows, "SELECT model, runs FROM pruned_runs WHERE user_id = ?", u.ID); err != nil {
		f.t.Fatal(err)
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Model] = r.Runs
	}
	return out
}

// TestPruneCountsOutputTokensAsUse: a model whose runs counted output tokens but cost nothing
// (a free model) used something, and the provider's invoice lists it: on a full day it is no
// refused name. Its row is not given up to a new model (a day of MaxPrunedModels-1 charged
// models and it keeps it, the model met last folded), and a new one of it takes the place of a
// row of a model that used nothing, as a charged one does. Either was lost when only input
// and cache tokens counted as use.
func TestPruneCountsOutputTokensAsUse(t *testing.T) {
	f := newAcctFixture(t)
	// A full day whose first model used output tokens alone; then a charged model.
	kept := f.user("output-kept", "standard")
	f.settleOutputOnly(kept, "r_outk_free", "gpt-4o-free")
	for i := range holds.MaxPrunedModels - 1 {
		f.settleAs(kept, fmt.Sprintf("r_outk_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	f.settleAs(kept, "r_outk_late", "gpt-4o-late", 1_000)
	f.ageRuns(kept, 10)
	// A full day whose first model used nothing; then a model that used output tokens alone.
	takes := f.user("output-takes", "standard")
	f.settleAs(takes, "r_outt_refused", "gpt-4o-refused", 0)
	for i := range holds.MaxPrunedModels - 1 {
		f.settleAs(takes, fmt.Sprintf("r_outt_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	f.settleOutputOnly(takes, "r_outt_free", "gpt-4o-free")
	f.ageRuns(takes, 10)

	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 50); err != nil {
		t.Fatal(err)
	}
	if r := f.prunedRuns(kept); len(r) != holds.MaxPrunedModels+1 || r["gpt-4o-free"] != 1 || r["gpt-4o-late"] != 0 || r[holds.FoldedModel] != 1 {
		t.Errorf("full day of a free model that used output tokens, then a new charged model: %d rows, free model's %d runs, "+
			"new model's %d, %d folded; want %d rows, the free model's own row kept, the new one folded",
			len(r), r["gpt-4o-free"], r["gpt-4o-late"], r[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
	if r := f.prunedRuns(takes); len(r) != holds.MaxPrunedModels+1 || r["gpt-4o-free"] != 1 || r["gpt-4o-refused"] != 0 || r[holds.FoldedModel] != 1 {
		t.Errorf("full day of a refused model, then a free model that used output tokens: %d rows, free model's %d runs, "+
			"refused model's %d, %d folded; want %d rows, the free model in the refused one's place, that one folded",
			len(r), r["gpt-4o-free"], r["gpt-4o-refused"], r[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
}

// TestPruneDoesNotTradeOneRefusedNameForAnother: on a full day a new model that used nothing
// is folded; it takes no place from a row of a model that used nothing too, which would delete
// and fold that row for no model an invoice lists.
func TestPruneDoesNotTradeOneRefusedNameForAnother(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("refused-names", "standard")
	f.settleAs(u, "r_trade_first", "gpt-4o-refused-a", 0)
	for i := range holds.MaxPrunedModels - 1 {
		f.settleAs(u, fmt.Sprintf("r_trade_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	f.settleAs(u, "r_trade_last", "gpt-4o-refused-b", 0)
	f.ageRuns(u, 10)
	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 50); err != nil {
		t.Fatal(err)
	}
	if r := f.prunedRuns(u); len(r) != holds.MaxPrunedModels+1 || r["gpt-4o-refused-a"] != 1 || r["gpt-4o-refused-b"] != 0 || r[holds.FoldedModel] != 1 {
		t.Errorf("full day with a refused name, then another: %d rows, first name's %d runs, second's %d, %d folded; "+
			"want %d rows, the first name's row kept, the second folded", len(r), r["gpt-4o-refused-a"], r["gpt-4o-refused-b"],
			r[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
}

// TestPruneKeepsTheRowOfARefusedNameTheBatchAddsTo: on a full day, a new charged model takes
// the place of a row of a model that used nothing, but not of one the same batch adds a run to:
// that row, deleted and folded, came back with the batch's sum as a new row, and the day held a
// row past its bound.
func TestPruneKeepsTheRowOfARefusedNameTheBatchAddsTo(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("refused-again", "standard")
	f.settleAs(u, "r_again_first", "gpt-4o-refused-a", 0)
	for i := range holds.MaxPrunedModels - 1 {
		f.settleAs(u, fmt.Sprintf("r_again_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	f.settleAs(u, "r_again_refused", "gpt-4o-refused-a", 0)
	f.settleAs(u, "r_again_new", "gpt-4o-new", 1_000)
	f.ageRuns(u, 10)
	// The first batch fills the day; the second adds to the refused name's row and brings a new model.
	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, holds.MaxPrunedModels); err != nil {
		t.Fatal(err)
	}
	if r := f.prunedRuns(u); len(r) != holds.MaxPrunedModels+1 || r["gpt-4o-refused-a"] != 2 || r["gpt-4o-new"] != 0 || r[holds.FoldedModel] != 1 {
		t.Errorf("full day, then a batch of a refused name that has its row and a new charged model: %d rows, "+
			"refused name's %d runs, new model's %d, %d folded; want %d rows, both refused runs in their row, the new model folded",
			len(r), r["gpt-4o-refused-a"], r["gpt-4o-new"], r[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
}
