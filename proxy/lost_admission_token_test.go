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

// TestLostAdmissionReleaseLeavesAnotherRequestsHold: the release of an idempotent attempt's
// admission whose commit went unanswered closes that admission's hold alone (its token). When
// the commit had not landed and a retry of the request took the attempt's run id meanwhile, the
// release leaves the retry's hold live: settled at 0 under it, the retry would run uncharged.
// Nor does it write a zero tally, which is for a run id made up for the refused request alone.
func TestLostAdmissionReleaseLeavesAnotherRequestsHold(t *testing.T) {
	h := newHarness(t, nil)
	u, _ := h.user("standard")
	ctx := context.Background()
	runID := proxy.IdempotentRunID(u.ID, "k-lost-commit", 0)
	ar := holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}
	retry, lost := ar, ar
	retry.Token, lost.Token = strings.Repeat("b", 32), strings.Repeat("a", 32)
	if _, err := h.store.Admit(ctx, retry); err != nil {
		t.Fatal(err)
	}
	h.srv.ReleaseLostAdmission(ctx, lost, fmt.Errorf("admit %s: %w", runID, holds.ErrOutcomeUnknown))
	h.settled()
	if r := h.run(u.ID, runID); r.State == holds.StateSettled {
		t.Fatalf("the retry's hold was settled by another admission's release: %+v", r)
	}
	if _, found, err := h.tally.Get(ctx, runID); err != nil || found {
		t.Fatalf("tally of the retry's run: found %t, %v; want none", found, err)
	}
	// The retry ends as a call that used nothing.
	if _, err := h.store.Settle(ctx, holds.Settlement{RunID: runID, UserID: u.ID, AdmitToken: retry.Token, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
