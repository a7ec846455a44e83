package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
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
	tx := testenv.ConsoleTx(t, h.db)
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

// TestLostAdmissionReleaseInTheRequestTriesOnce: past the settlement slots the release runs in
// the request, before the refused caller's 503 is written, so there it makes one try: the
// tries again that a background release makes while the database is out of reach (for as long
// as the hold lives, 15 minutes by default) would hold the caller's answer as long.
func TestLostAdmissionReleaseInTheRequestTriesOnce(t *testing.T) {
	h, lossy, logs := newObservedLossyHarness(t, nil)
	_, key := h.user("standard")
	giveBack := h.srv.TakeSettleSlots()
	defer giveBack()
	armCommitLost(lossy)
	answered := make(chan int, 1)
	go func() {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "once-" + testenv.RandomID(4)})
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case status := <-answered:
			lossy.Restore()
			if status != http.StatusServiceUnavailable {
				t.Fatalf("admission with a lost commit reply and the database down: %d, want 503", status)
			}
			if logs.FilterMessageSnippet("lost admission not released; the reconciler will settle it").Len() != 1 {
				t.Fatalf("logs %v: want the one try's failure", logs.All())
			}
			return
		case <-deadline:
			lossy.Restore()
			t.Fatal("no answer within 30s")
		case <-time.After(20 * time.Millisecond):
			if logs.FilterMessageSnippet("trying again").Len() > 0 {
				lossy.Restore() // lets the release, and the caller's answer, end
				<-answered
				t.Fatal("the release run in the request tried again while the database was down: the caller's 503 waited for it")
			}
		}
	}
}
