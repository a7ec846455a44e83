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
