package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestBalanceShowsSpentInRunsApartFromHeld: a named run whose calls have used less than its
// hold shows in the balance as held (the hold, 20 credits) and spent_in_runs (what its calls
// used, 5), two figures. Mutant: spent_in_runs shown as the held figure.
func TestBalanceShowsSpentInRunsApartFromHeld(t *testing.T) {
	f := newFixture(t, adminToken)
	f.admin("POST", "/admin/users", map[string]any{"name": "ann"}, http.StatusCreated)
	u, err := f.store.UserByName(f.ctx(), "ann")
	if err != nil {
		t.Fatal(err)
	}
	f.admitInOneBatch([]holds.AdmitRequest{{RunID: "x_agent", UserID: u.ID, ClientRunID: "agent", Model: "gpt-a",
		State: holds.StateRunning, TTL: time.Hour}})
	if ok, err := f.store.RecordRunCall(f.ctx(), "x_agent", token.New(), time.Hour, pricing.Usage{Input: 10, Output: 5}, 5_000, 1, false); err != nil || !ok {
		t.Fatalf("record the run's call: %v, %v", ok, err)
	}
	b := f.admin("GET", "/admin/users/ann/balance", nil, http.StatusOK)
	if b["held"] != json.Number("20") || b["spent_in_runs"] != json.Number("5") || b["in_flight"] != json.Number("1") {
		t.Errorf("balance %v, want held 20, spent_in_runs 5, in_flight 1", b)
	}
}
