package holds_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestTwoFirstGatewaysRecordOneCreditUnit: two gateways starting at once on a database with
// no credit_micro recorded, at two values: one records its value, the other is compared with
// it and refused, whichever wins; neither overwrites the other.
func TestTwoFirstGatewaysRecordOneCreditUnit(t *testing.T) {
	e := newStoreEnv(t)
	for round := 0; round < 20; round++ {
		if _, err := e.db.Exec("DELETE FROM credit_unit"); err != nil {
			t.Fatal(err)
		}
		values := []int64{1000, 10_000}
		errs := make([]error, len(values))
		var wg sync.WaitGroup
		for i, v := range values {
			wg.Go(func() { _, _, errs[i] = e.store.RecordCreditUnit(e.ctx(), v, "gw", false) })
		}
		wg.Wait()
		u, err := e.store.CreditUnit(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range values {
			var mismatch *holds.CreditUnitMismatchError
			switch {
			case v == u.CreditMicro && errs[i] != nil:
				t.Fatalf("round %d: the gateway whose %d is recorded was refused: %v", round, v, errs[i])
			case v != u.CreditMicro && (!errors.As(errs[i], &mismatch) || mismatch.Recorded.CreditMicro != u.CreditMicro):
				t.Fatalf("round %d: the gateway at %d beside %d recorded: %v, want a mismatch", round, v, u.CreditMicro, errs[i])
			}
		}
		if err := e.store.CheckCreditUnit(e.ctx(), u.CreditMicro); err != nil {
			t.Fatalf("round %d: check of the recorded value: %v", round, err)
		}
	}
}
