package holds_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestWriterAdmissionRunsByItsCallersDeadline: an admission whose context ends before
// AdmitTimeout does (a call's steps before forwarding share one admit_timeout, and this
// admission comes after others) runs its batch under that earlier deadline. It used to get a
// whole AdmitTimeout of its own from its offer, whatever its caller had left.
func TestWriterAdmissionRunsByItsCallersDeadline(t *testing.T) {
	db := testenv.MySQL(t)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx := context.Background()
	u, err := st.CreateUser(ctx, "ctxdeadline-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var shapes []holds.BatchShape
	w := holds.NewWriter(st, holds.WriterConfig{Workers: 1, AdmitTimeout: 2 * time.Minute, SettleTimeout: 10 * time.Minute,
		OnBatch: func(s holds.BatchShape) { mu.Lock(); shapes = append(shapes, s); mu.Unlock() }})
	defer w.Close()
	deadline := time.Now().Add(time.Minute)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	runID := "r_ctxdeadline_" + testenv.RandomID(6)
	if _, err := w.Admit(actx, holds.AdmitRequest{RunID: runID, UserID: u.ID, State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := shapes
	mu.Unlock()
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
