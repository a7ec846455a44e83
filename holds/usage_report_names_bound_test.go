package holds_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestOneCallersModelNamesDoNotRefuseTheReport: prices match by prefix, so a caller can send
// any number of distinct model names in a day ("gpt-4o-<random>"), each admitted, refused by
// the provider and settled at 0, each a report row until it is pruned. Past the report's row
// bound (100 000, lowered here) the report was refused whole: the all-users report of every
// range holding that day, and the one README says to ask instead, that user's own report, even
// of that one day, until someone ran a prune. A report now shows at most MaxPrunedModels models
// of a user's day by name, as a pruned day keeps them, the rest summed into the FoldedModel row:
// a user's report of a day is at most MaxPrunedModels+1 rows whatever the caller sent, and
// every total stays exact.
func TestOneCallersModelNamesDoNotRefuseTheReport(t *testing.T) {
	f := newAcctFixture(t)
	const names = holds.MaxPrunedModels + 20
	u := f.user("many-names", "standard")
	other := f.user("quiet", "standard")
	for i := range names {
		f.settleAs(u, fmt.Sprintf("r_junk_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 0)
	}
	f.settleAs(u, "r_real_1", "gpt-4o", 12_000)
	f.settleAs(u, "r_real_2", "gpt-4o-mini", 3_000)
	f.settleAs(other, "r_other_1", "gpt-4o", 5_000)
	// The day the calls settled on, not UTC_DATE(): midnight may have passed since.
	today, err := testenv.SettledDay(f.ctx(), f.db, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Room for every user's day at the bound (and its folded row), not for a row per name sent.
	defer holds.SetMaxReportRows(holds.MaxPrunedModels + 10)()
	for _, who := range []struct {
		name string
		id   uint64
		runs int64
	}{{"user by user", u.ID, names + 2}, {"all users", 0, names + 3}} {
		rep, err := f.store.Usage(f.ctx(), today, today, who.id)
		if errors.Is(err, holds.ErrBadFilter) {
			t.Errorf("%s: one caller's %d model names in a day refused the report: %v", who.name, names, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		perUser := map[uint64]int{}
		own := map[string]holds.UsageRow{}
		for _, r := range rep.Rows {
			if perUser[r.UserID]++; r.UserID == u.ID {
				own[r.Model] = r
			}
		}
		if perUser[u.ID] > holds.MaxPrunedModels+1 {
			t.Errorf("%s: %d rows for one user's day; want at most %d", who.name, perUser[u.ID], holds.MaxPrunedModels+1)
		}
		if rep.Totals.Runs != who.runs || rep.Totals.ChargedMicro != rep.LedgerMicro || rep.Totals.ChargedRuns != rep.LedgerRuns {
			t.Errorf("%s: totals %+v (ledger %d, %d runs); want %d runs, the ledger's charges", who.name, rep.Totals,
				rep.LedgerMicro, rep.LedgerRuns, who.runs)
		}
		for model, micro := range map[string]int64{"gpt-4o": 12_000, "gpt-4o-mini": 3_000} {
			if r, ok := own[model]; !ok || r.ChargedMicro != micro || r.Runs != 1 {
				t.Errorf("%s: %s's row %+v (found %v); want its own row, charged %d", who.name, model, r, ok, micro)
			}
		}
		if r := own[holds.FoldedModel]; r.Runs != names-(holds.MaxPrunedModels-2) || r.ChargedMicro != 0 {
			t.Errorf("%s: folded row %+v; want the %d refused names past the bound, charged nothing", who.name, r,
				names-(holds.MaxPrunedModels-2))
		}
	}
}
