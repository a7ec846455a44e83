package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcilerKeepsThePricesAHoldWasAdmittedAt: a gateway records the prices of a call's
// model on its hold when it admits it, and computes the call's cost at those prices. When
// that gateway is killed and one restarted with a new price table reconciles the run from its
// tally (the old prices' cost), the settled row must keep the snapshot of the prices the cost
// was computed at, not the reconciling process's: otherwise the bill cannot be explained.
func TestReconcilerKeepsThePricesAHoldWasAdmittedAt(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("repriced", 3, nil)
	oldPrices := []byte(`{"model":"fake-gpt","input":"1","output":"2"}`)
	newPrices := []byte(`{"model":"fake-gpt","input":"5","output":"9"}`)
	h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_repriced", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour, PriceSnapshot: oldPrices})
	if err != nil {
		t.Fatal(err)
	}
	e.addTally(h.RunID, pricing.Usage{Input: 1000, Output: 1000}, 3_000) // at the old prices
	e.expire(h.RunID)
	rec := e.reconciler("restarted", func(c *holds.ReconcilerConfig) {
		c.PriceSnapshot = func(string) []byte { return newPrices }
	})
	if st, err := e.pass(rec); err != nil || st.FromTally != 1 {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	var snap string
	if err := e.db.GetContext(e.ctx(), &snap, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", h.RunID); err != nil {
		t.Fatal(err)
	}
	if snap != string(oldPrices) {
		t.Fatalf("settled row's price snapshot %s, want the prices its cost was computed at %s", snap, oldPrices)
	}
}

// TestReconcilerSnapshotsARunAdmittedWithoutPrices: a hold admitted by a gateway that recorded
// no prices (one from before they were recorded at admission) still gets the reconciling
// process's snapshot, the closest record there is.
func TestReconcilerSnapshotsARunAdmittedWithoutPrices(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("unpriced-hold", 3, nil)
	h := e.admit(u, "r_nosnap", holds.StateRunning)
	e.addTally(h.RunID, pricing.Usage{Input: 10}, 10)
	e.expire(h.RunID)
	prices := []byte(`{"model":"fake-gpt","input":"1","output":"2"}`)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.PriceSnapshot = func(string) []byte { return prices } })
	if st, err := e.pass(rec); err != nil || st.FromTally != 1 {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	var snap string
	if err := e.db.GetContext(e.ctx(), &snap, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", h.RunID); err != nil || snap != string(prices) {
		t.Fatalf("snapshot %q, %v; want %s", snap, err, prices)
	}
}
