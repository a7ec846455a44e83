package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestReportLedgerIsTheDayLedger: the usage report shows the day ledger beside the totals of
// its rows so that an operator sees when they disagree; the ledger it shows is read from the
// ledger, never copied from the totals. The ledger is made to disagree by hand (one credit and
// one run more), then put back before the test's ledger audit. Mutant: the ledger's charged
// shown as the totals' charged.
func TestReportLedgerIsTheDayLedger(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "ann")
	if err != nil {
		t.Fatal(err)
	}
	f.settledRun(u.ID, "r_1", 1_234)
	skew := func(by int) {
		t.Helper()
		if _, err := f.db.ExecContext(f.ctx(), "UPDATE usage_days SET used_micro = used_micro + ?, run_count = run_count + ? WHERE user_id = ?",
			by*1_000, by, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	skew(1)
	t.Cleanup(func() { skew(-1) }) // before the fixture's ledger audit

	// format=json names the default. Mutant: only csv taken as a format.
	day := f.settledDay() // not the default day: midnight may have passed since the settlement
	rep := f.admin("GET", "/admin/reports/usage?format=json&from="+day+"&to="+day, nil, http.StatusOK)
	totals, _ := rep["totals"].(map[string]any)
	led, _ := rep["ledger"].(map[string]any)
	if totals["charged"] != json.Number("1.234") || totals["charged_runs"] != json.Number("1") {
		t.Errorf("report totals %v, want charged 1.234 over 1 run, the settled run's", totals)
	}
	if led["charged"] != json.Number("2.234") || led["charged_runs"] != json.Number("2") {
		t.Errorf("report ledger %v, want charged 2.234 over 2 runs, what usage_days holds", led)
	}
}
