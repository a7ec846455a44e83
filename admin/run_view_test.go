package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestSettledRunShowsItsMoneyApart: a settled run, in the runs listing and in the usage
// report's rows, totals and CSV, shows its cost, what was charged after its discount, and the
// parts of that charge taken from today's allowance and from prepaid credits, each its own
// figure. The user's allowance is 1 credit and the discount 10%, so a run costing 5 credits is
// charged 4.5: 1 from the allowance, 3.5 from prepaid. Mutants: the run view's allowance_part
// and prepaid_part swapped; the report row's cost and charged swapped; the CSV's allowance_part
// and prepaid_part columns swapped.
func TestSettledRunShowsItsMoneyApart(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	f.admin("POST", "/admin/users/ann/grants", map[string]any{"amount": "100", "idempotency_key": "ann-1"}, http.StatusCreated)
	f.admin("PATCH", "/admin/users/ann", map[string]any{"allowance": "1", "discount_bp": 1000}, http.StatusOK)
	u, err := f.store.UserByName(f.ctx(), "ann")
	if err != nil {
		t.Fatal(err)
	}
	f.settledRun(u.ID, "r_1", 5_000)

	runs := f.admin("GET", "/admin/runs?user=ann", nil, http.StatusOK)
	data, _ := runs["data"].([]any)
	if len(data) != 1 {
		t.Fatalf("runs %v, want the one settled", runs)
	}
	r, _ := data[0].(map[string]any)
	money := map[string]string{"cost": "5", "charged": "4.5", "allowance_part": "1", "prepaid_part": "3.5"}
	for field, want := range money {
		if r[field] != json.Number(want) {
			t.Errorf("run %s %v, want %s (run %v)", field, r[field], want, r)
		}
	}
	if r["discount_bp"] != json.Number("1000") {
		t.Errorf("run discount_bp %v, want 1000", r["discount_bp"])
	}

	// A run still running shows no settlement: no cost, charge or parts of one yet. Mutant:
	// the settled fields shown whatever the run's state (charged 0 for a live run).
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "r_live", UserID: u.ID, Model: "gpt-a", State: holds.StateRunning, TTL: time.Minute}})
	live := f.admin("GET", "/admin/runs?user=ann&state=running", nil, http.StatusOK)
	if data, _ := live["data"].([]any); len(data) != 1 {
		t.Errorf("running runs %v, want r_live", live)
	} else {
		lr, _ := data[0].(map[string]any)
		for _, field := range []string{"cost", "charged", "allowance_part", "prepaid_part", "settled_at", "settle_source"} {
			if v, ok := lr[field]; ok {
				t.Errorf("running run shows %s %v, want none until it settles (run %v)", field, v, lr)
			}
		}
	}

	day := f.settledDay() // not the default day: midnight may have passed since the settlement
	rep := f.admin("GET", "/admin/reports/usage?user=ann&from="+day+"&to="+day, nil, http.StatusOK)
	rows, _ := rep["data"].([]any)
	if len(rows) != 1 {
		t.Fatalf("report rows %v, want the run's one", rep["data"])
	}
	row, _ := rows[0].(map[string]any)
	totals, _ := rep["totals"].(map[string]any)
	for field, want := range money {
		if row[field] != json.Number(want) {
			t.Errorf("report row %s %v, want %s (row %v)", field, row[field], want, row)
		}
		if totals[field] != json.Number(want) {
			t.Errorf("report totals %s %v, want %s (totals %v)", field, totals[field], want, totals)
		}
	}
	recs := f.csvReport(t)
	if len(recs) != 2 {
		t.Fatalf("CSV report %v, want a header and the run's row", recs)
	}
	for i, col := range recs[0] {
		if want, ok := money[col]; ok && recs[1][i] != want {
			t.Errorf("CSV %s %q, want %s (row %v)", col, recs[1][i], want, recs[1])
		}
	}
	if b := f.admin("GET", "/admin/users/ann/balance", nil, http.StatusOK); b["prepaid"] != json.Number("96.5") {
		t.Errorf("balance %v, want prepaid 96.5: 100 less the run's prepaid part", b)
	}
}
