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

// TestReconcilerSettlesATallyWhosePricesAreNoJSON: a one-call run's tally carries the prices
// its call was billed at when another model answered it (runstate.Tally.RecordCallWith), which
// the reconciler records on the settled row. The tally is Redis's word (TallyBelievable): a
// snapshot that is no JSON (a hand edit, a gateway of another version writing it otherwise)
// is refused by the row's JSON column, and the settlement failed on every pass until the
// tally lapsed, when the run was charged what it held. The run settles from its tally's
// figures, keeping the prices its hold recorded.
func TestReconcilerSettlesATallyWhosePricesAreNoJSON(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("bad-snapshot", 3, nil)
	held := []byte(`{"model":"fake-gpt","input":"1","output":"2"}`)
	h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_badsnap", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour, PriceSnapshot: held})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.tally.RecordCallWith(e.ctx(), h.RunID, 1, pricing.Usage{Input: 1000, Output: 1000}, 3_000, false,
		[]byte(`{"model":"fake-gpt-dear",`), nil); err != nil {
		t.Fatal(err)
	}
	e.expire(h.RunID)
	if st, err := e.pass(e.reconciler("me", nil)); err != nil || st.FromTally != 1 {
		t.Fatalf("reconcile: %+v, %v; want the run settled from its tally", st, err)
	}
	var row struct {
		Cost int64  `db:"cost_micro"`
		Snap string `db:"price_snapshot"`
	}
	if err := e.db.GetContext(e.ctx(), &row, "SELECT cost_micro, price_snapshot FROM run_holds WHERE run_id = ?", h.RunID); err != nil {
		t.Fatal(err)
	}
	if row.Cost != 3_000 || row.Snap != string(held) {
		t.Fatalf("settled at %d with snapshot %s; want 3000 with the hold's %s", row.Cost, row.Snap, held)
	}
}
