package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterAdmissionRunsByItsCallersDeadline: an admission whose context ends before
// AdmitTimeout does (a call's steps before forwarding share one admit_timeout, and this
// admission comes after others) runs its batch under that earlier deadline. It used to get a
// whole AdmitTimeout of its own from its offer, whatever its caller had left.
func TestWriterAdmissionRunsByItsCallersDeadline(t *testing.T) {
	_, st, users := storeWithUsers(t, "ctxdeadline", 1)
	u := users[0]
	ctx := context.Background()
	var seen shapes
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, AdmitTimeout: 2 * time.Minute, SettleTimeout: 10 * time.Minute,
		OnBatch: seen.add})
	defer w.Close()
	deadline := time.Now().Add(time.Minute)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	runID := "r_ctxdeadline_" + testenv.RandomID(6)
	if _, err := w.Admit(actx, holds.AdmitRequest{RunID: runID, UserID: u.ID, State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	got := seen.list()
	if len(got) != 1 || got[0].Admissions != 1 {
		t.Fatalf("batches %+v, want the one admission's", got)
	}
	if !got[0].Deadline.Equal(deadline) {
		t.Fatalf("the admission's batch ran until %v after its caller's deadline, want by it", got[0].Deadline.Sub(deadline))
	}
	if _, err := w.Settle(ctx, holds.Settlement{RunID: runID, UserID: u.ID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
