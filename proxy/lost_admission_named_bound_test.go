package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestLostNamedRunAdmissionZeroTallyTakesASettlementSlot: a named run's lost admission is not
// released but gets a zero tally, retried while a settlement would be (markRunUnused). That
// work takes a settlement slot like any other, and past the slots runs in the request, so
// that a refused caller retrying its 503s cannot pile up a goroutine per refusal while Redis
// loses writes. Here every slot is taken and the first zero-tally write is lost: the call
// returns only once the retry has landed it. (Mutant: the work started in a goroutine of its
// own, as before; the call returned with the tally still to be written.)
func TestLostNamedRunAdmissionZeroTallyTakesASettlementSlot(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, _ := h.user("standard")
	ctx := context.Background()
	runID := proxy.RunIDFor(u.ID, "task-lost-bound")
	ar := holds.AdmitRequest{RunID: runID, ClientRunID: "task-lost-bound", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute}
	giveBack := h.srv.TakeSettleSlots()
	defer giveBack()
	// The zero tally's MULTI/EXEC, which go-redis does not resend: markRunUnused tries again
	// after tallyRetryFirst.
	lossy.Arm(h.keys.Prefix+"billing:usage:{", testenv.RedisRequestLost, 1)
	h.srv.ReleaseLostAdmission(ctx, ar, fmt.Errorf("admit %s: %w", runID, holds.ErrOutcomeUnknown))
	if lossy.Fired() != 1 {
		t.Fatalf("%d zero-tally writes lost by the time the call returned, want 1", lossy.Fired())
	}
	tl, found, err := h.tally.Get(ctx, runID)
	if err != nil || !found || tl.Calls != 0 || tl.CostMicro != 0 {
		t.Fatalf("tally %+v (found %v, %v) when the call returned: with no slot free, want the zero tally written in it", tl, found, err)
	}
}
