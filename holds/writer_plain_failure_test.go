package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterSettlementThatWroteNothingIsNotUnknown: a settlement shares a batch with an
// admission; the database goes out of reach as the batch begins, before any of its writes
// was sent, and stays so through the settlement's retry alone. Nothing can have been charged:
// the settlement is told a plain failure, not ErrOutcomeUnknown, which keeps a named run
// closed as if its settlement may have committed (its calls refused as settled) until the
// close lapses.
func TestWriterSettlementThatWroteNothingIsNotUnknown(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	f.admit("r_mixed_unsent")
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, Linger: 2 * time.Second,
		AdmitTimeout: 500 * time.Millisecond, SettleTimeout: 3 * time.Second})
	defer w.Close()
	lossy.Arm("START TRANSACTION", testenv.GoDown)
	settled := settleAsync(w, holds.Settlement{RunID: "r_mixed_unsent", UserID: f.user.ID, CostMicro: 7_000, Source: holds.SourceComplete})
	waitGathered(t, w, 1)
	_, aerr := w.Admit(ctx, holds.AdmitRequest{RunID: "r_mixed_unsent_new", UserID: f.user.ID, State: holds.StateRunning,
		TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)})
	s := <-settled
	if !lossy.Fired() || !lossy.Down() {
		t.Fatalf("the mixed batch never lost the database (admission %v, settlement %v)", aerr, s.err)
	}
	lossy.Restore()
	if s.err == nil || errors.Is(s.err, holds.ErrOutcomeUnknown) {
		t.Errorf("settlement whose batch wrote nothing and whose retry alone failed: %+v, %v; want a plain failure", s.res, s.err)
	}
	if aerr == nil || errors.Is(aerr, holds.ErrOutcomeUnknown) {
		t.Errorf("admission whose batch wrote nothing: %v; want a plain failure", aerr)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 0 {
		t.Fatalf("balance %+v, %v: want nothing charged", bal, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_mixed_unsent", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}
