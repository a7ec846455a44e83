package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordRunCallKeepsAnEarlierCallsEstimatedMark: a named run's row keeps the estimated
// mark of a call charged an estimate (no usage report) when a later call of it reports its
// usage: the row's tokens are then still not all the provider's own count. The row is the
// run's only record once a Redis restart has lost its tally, and a settlement from it keeps
// that mark (README: the estimated mark stands whichever record is charged).
func TestRecordRunCallKeepsAnEarlierCallsEstimatedMark(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_est", 3, nil)
	h := e.admit(u, "x_rec_est", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 5}, 70, 1, true); err != nil || !ok {
		t.Fatalf("record of the estimated call: %v, %v", ok, err)
	}
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 5}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record of the reported call: %v, %v", ok, err)
	}
	if r := e.run(u, h.RunID); !r.Estimated || r.Calls != 2 || r.EndedCalls != 2 || r.CostMicro != 140 {
		t.Fatalf("run's row %+v after an estimated call and a reported one: want estimated, 2 calls, cost 140", r)
	}
}

// TestSettlementKeepsTheRowsEstimatedMark: a named run whose row a call charged an estimate
// marked is settled from a tally that does not carry the mark (a settlement says estimated
// only when its own figures are); the settled run keeps it, whichever record it was charged
// from (README: the estimated mark stands whichever record is charged). Written over, the
// settlement cleared the mark of a run charged partly by estimate.
func TestSettlementKeepsTheRowsEstimatedMark(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("settle_est", 3, nil)
	h := e.admit(u, "x_settle_est", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 5}, 70, 1, true); err != nil || !ok {
		t.Fatalf("record of the estimated call: %v, %v", ok, err)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, UserID: u.ID, Usage: pricing.Usage{Input: 10, Output: 5},
		CostMicro: 70, Calls: 1, Source: holds.SourceClient}); err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, h.RunID); r.State != holds.StateSettled || !r.Estimated {
		t.Errorf("run %+v settled after an estimated call: want it settled, still marked estimated", r)
	}
}
