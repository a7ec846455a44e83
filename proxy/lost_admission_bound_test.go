package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestLostAdmissionReleaseTakesASettlementSlot: the release of an admission whose outcome is
// unknown runs in the background only while a settlement slot is free, as every settlement
// does; past the slots it runs in the request. Each lost admission started a goroutine of its
// own, living up to settle_timeout, while the refused caller was answered at once and free to
// send the next: with the database losing commit replies, a busy gateway (or one caller
// retrying its 503s) piled up rate x settle_timeout goroutines with nothing to bound them.
func TestLostAdmissionReleaseTakesASettlementSlot(t *testing.T) {
	h := newHarness(t, nil)
	u, _ := h.user("standard")
	ctx := context.Background()
	runID := proxy.IdempotentRunID(u.ID, "k-lost-bound", 0)
	ar := holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute,
		Token: strings.Repeat("c", 32)}
	if _, err := h.store.Admit(ctx, ar); err != nil {
		t.Fatal(err)
	}
	// The release waits on the run's row until the test lets it go.
	tx, err := h.db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var locked string
	if err := tx.Get(&locked, "SELECT run_id FROM run_holds WHERE run_id = ? FOR UPDATE", runID); err != nil {
		t.Fatal(err)
	}
	giveBack := h.srv.TakeSettleSlots()
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		h.srv.ReleaseLostAdmission(ctx, ar, fmt.Errorf("admit %s: %w", runID, holds.ErrOutcomeUnknown))
	}()
	waitRunHoldsStatements(t, h, 1)
	select {
	case <-returned:
		t.Fatal("with every settlement slot taken, the lost admission's release was left running in a goroutine of its own")
	default:
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("the release did not end once the row was free")
	}
	giveBack()
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro != 0 {
		t.Fatalf("lost admission's run: %s charged %d, want settled at 0", r.State, r.ChargedMicro)
	}
}
