package holds_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestUsageReportTellsModelsApartByteForByte: the report groups by the model each call named,
// and the gateway prices and forwards model names byte for byte ("gpt-4o-MINI" is priced by the
// prefix "gpt-4o", "gpt-4o-mini" by its own name). The report grouped them under the column's
// collation, which folds case and ignores trailing spaces: the runs of "gpt-4o-X" and "gpt-4o-x"
// (and of "gpt-4o" and "gpt-4o ") were one row, named after either, whose tokens and cost no
// single price explains. A prune kept them merged too (pruned_runs' key had the same collation),
// so the fix must hold before a prune and after it.
func TestUsageReportTellsModelsApartByteForByte(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("modeller", "standard")
	models := []string{"gpt-4o-X", "gpt-4o-x", "gpt-4o", "gpt-4o "}
	for i, m := range models {
		id := "r_model_" + string(rune('a'+i))
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: m, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: int64(1_000 * (i + 1)), Calls: 1,
			Usage: pricingUsage(int64(1_000 * (i + 1))), Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	// The day the calls settled on, not UTC_DATE(): midnight may have passed since.
	today, err := testenv.SettledDay(f.ctx(), f.db, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, from time.Time) holds.UsageReport {
		t.Helper()
		rep, err := f.store.Usage(f.ctx(), from, today, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, r := range rep.Rows {
			got[r.Model] = r.CostMicro
		}
		want := map[string]int64{"gpt-4o-X": 1_000, "gpt-4o-x": 2_000, "gpt-4o": 3_000, "gpt-4o ": 4_000}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: report rows' cost by model %#v, want each model its own row %#v", when, got, want)
		}
		if rep.Totals.ChargedMicro != 10_000 || rep.LedgerMicro != 10_000 {
			t.Errorf("%s: totals %d, ledger %d, want 10000", when, rep.Totals.ChargedMicro, rep.LedgerMicro)
		}
		return rep
	}
	check("today", today)

	f.ageRuns(u, 10)
	from := today.AddDate(0, 0, -10)
	aged := check("aged, before the prune", from)
	if res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 100); err != nil || res.Runs != int64(len(models)) {
		t.Fatalf("prune: %+v, %v; want the %d runs", res, err, len(models))
	}
	if after := check("after the prune", from); !reflect.DeepEqual(after.Rows, aged.Rows) {
		t.Errorf("report changed by the prune:\nbefore %+v\nafter  %+v", aged.Rows, after.Rows)
	}
}
