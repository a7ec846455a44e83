package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterSettlementRetriedAloneAfterALostCommitIsApplied: a settlement shares a batch
// with an admission; the batch's COMMIT goes out and its reply is lost, and the database
// stays out of reach past the admission's deadline, so the writer tries the settlement again
// alone. That retry finds the run settled by the settlement itself, and must say so (applied,
// with what it charged), as a retry within one batch does: otherwise the metrics count it
// applied="false" and the money it charged is missing from them.
func TestWriterSettlementRetriedAloneAfterALostCommitIsApplied(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	f.admit("r_mixed_lost")
	restored := false
	// The admission's deadline is long enough for the batch to reach its COMMIT; the database
	// then stays out of reach until the deadline has passed.
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, Linger: 5 * time.Second,
		AdmitTimeout: time.Second, SettleTimeout: 10 * time.Second,
		OnBatch: func(b holds.BatchShape) {
			// The mixed batch gave up: the database comes back for the settlement's retry.
			if b.Admissions > 0 && b.Err != nil && !restored {
				restored = true
				lossy.Restore()
			}
		}})
	defer w.Close()
	s, aerr := lostMixedBatch(t, w, lossy, holds.Settlement{RunID: "r_mixed_lost", UserID: f.user.ID, CostMicro: 7_000, Source: holds.SourceComplete}, f.user.ID, "r_mixed_new")
	if !lossy.Fired() || !restored {
		t.Fatalf("the mixed batch's commit reply was never lost (fired %v, restored %v; admission %v)", lossy.Fired(), restored, aerr)
	}
	if s.err != nil || !s.res.Applied || s.res.ChargedMicro != 7_000 {
		t.Errorf("settlement whose batch committed and lost its reply, retried alone: %+v, %v; want applied, charged 7,000", s.res, s.err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 7_000 {
		t.Fatalf("balance %+v, %v: want one charge of 7,000", bal, err)
	}
	// The admission committed too; release it.
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_mixed_new", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}

// TestWriterSettlementStaysUnknownWhenItsRetryAloneFails: a settlement shares a batch with an
// admission; the batch's COMMIT goes out, the server commits it, the reply is lost, and the
// database stays out of reach through the admission's deadline and then the settlement's own
// retry. The settlement may have been applied (it was), so its caller must be told
// ErrOutcomeUnknown, as a batch of settlements alone tells it (see WriteBatch): the retry's
// plain "unreachable" says nothing was charged, which is false.
func TestWriterSettlementStaysUnknownWhenItsRetryAloneFails(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	f.admit("r_mixed_down")
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, Linger: 2 * time.Second,
		AdmitTimeout: 500 * time.Millisecond, SettleTimeout: 3 * time.Second})
	defer w.Close()
	s, aerr := lostMixedBatch(t, w, lossy, holds.Settlement{RunID: "r_mixed_down", UserID: f.user.ID, CostMicro: 7_000, Source: holds.SourceComplete}, f.user.ID, "r_mixed_down_new")
	if !lossy.Fired() || !lossy.Down() {
		t.Fatalf("the mixed batch's commit reply was never lost (admission %v, settlement %v)", aerr, s.err)
	}
	lossy.Restore()
	if !errors.Is(aerr, holds.ErrOutcomeUnknown) {
		t.Errorf("admission whose commit went unanswered: %v; want ErrOutcomeUnknown", aerr)
	}
	if !errors.Is(s.err, holds.ErrOutcomeUnknown) {
		t.Errorf("settlement whose commit went unanswered and whose retry alone failed: %+v, %v; want ErrOutcomeUnknown", s.res, s.err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 7_000 {
		t.Fatalf("balance %+v, %v: want the one charge of 7,000 the lost commit made", bal, err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_mixed_down_new", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}

// TestWriterAdmissionThatWroteNothingIsNotUnknown: a settlement and an admission that is
// refused (its user does not exist) share a batch whose COMMIT goes out unanswered, and the
// database stays out of reach. Only the settlement's writes went out: the admission held
// nothing and must be told a plain failure, not ErrOutcomeUnknown, which sends its caller to
// release a hold that does not exist (and counts it as a lost admission).
func TestWriterAdmissionThatWroteNothingIsNotUnknown(t *testing.T) {
	f, lossy := newLossyFixture(t)
	f.admit("r_mixed_refused")
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, Linger: 2 * time.Second,
		AdmitTimeout: 500 * time.Millisecond, SettleTimeout: 3 * time.Second})
	defer w.Close()
	s, aerr := lostMixedBatch(t, w, lossy, holds.Settlement{RunID: "r_mixed_refused", UserID: f.user.ID, CostMicro: 7_000, Source: holds.SourceComplete}, 1<<60, "r_mixed_refused_new")
	if !lossy.Fired() || !lossy.Down() {
		t.Fatalf("the mixed batch's commit reply was never lost (admission %v, settlement %v)", aerr, s.err)
	}
	lossy.Restore()
	if aerr == nil || errors.Is(aerr, holds.ErrOutcomeUnknown) {
		t.Errorf("admission refused in a batch whose commit went unanswered: %v; want a plain failure", aerr)
	}
	if !errors.Is(s.err, holds.ErrOutcomeUnknown) {
		t.Errorf("settlement whose commit went unanswered: %+v, %v; want ErrOutcomeUnknown", s.res, s.err)
	}
	if n, _ := holdRows(t, f.store, "r_mixed_refused_new"); n != 0 {
		t.Fatalf("the refused admission left %d rows", n)
	}
}

// lostMixedBatch settles st and admits a fresh run newRun of userID in one batch of w (whose
// linger holds the settlement for the admission) and loses that batch's COMMIT reply, the
// database going out of reach (lossy); it returns what the settlement and the admission were
// told.
func lostMixedBatch(t *testing.T, w *holds.Writer, lossy *testenv.Lossy, st holds.Settlement, userID uint64, newRun string) (settleOutcome, error) {
	t.Helper()
	lossy.Arm(commitScript, testenv.GoDown)
	settled := settleAsync(w, st)
	waitGathered(t, w, 1)
	_, aerr := w.Admit(context.Background(), holds.AdmitRequest{RunID: newRun, UserID: userID, State: holds.StateRunning,
		TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)})
	return <-settled, aerr
}
