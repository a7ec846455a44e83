package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestLongPromptWhoseSettlementEndedDuringItsAdmissionWaitsForTheNext: a long prompt sent while
// two answered calls of its user settle, one of whose settlements lands while the prompt's
// admission is under way (before its read), is granted what the other's hold leaves: too small.
// admitFitting released it and, told a settlement had ended since its mark, admitted it again
// at once: the same cap, as that settlement was already in it, which it took for "a settlement
// did not raise the cap" and refused 402 — though the other settlement, still to land, gave
// back what the call needed, and the same call sent a moment later was served. It must wait for
// that one (README, 402 insufficient_credits).
func TestLongPromptWhoseSettlementEndedDuringItsAdmissionWaitsForTheNext(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.Credits{Milli: 40_500} // two holds of 20, and a little
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var opened [2]sync.Once
	open := func(i int) { opened[i].Do(func() { close(gates[i]) }) }
	defer open(0)
	defer open(1)
	var settles, admits, waits atomic.Int32
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		switch step {
		case "settle":
			if n := settles.Add(1); n <= 2 {
				<-gates[n-1] // the two answered calls' settlements, held until let go
			}
		case "admit":
			if admits.Add(1) == 3 {
				// The long prompt's admission: the first call's settlement lands now, before
				// the admission reads its user's holds.
				open(0)
				for h.srv.SettlingCalls(u.ID) > 1 && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		case "admission waits for a settlement":
			if waits.Add(1) == 2 {
				open(1) // the second call's settlement lands once the long prompt waits for it
			}
		}
	})
	for i := range 2 {
		sendOK(t, fmt.Sprintf("call %d", i+1), h.gw.URL, key, chatBody, nil)
	}
	long := send(h.gw.URL, key, longPromptBody(9000), nil)
	open(1)
	if n := waits.Load(); n == 0 {
		t.Fatalf("the long prompt never waited: its first hold paid for it (a prompt too short for this test)")
	}
	if long.status != http.StatusOK {
		t.Errorf("a long prompt while two answered calls settled: %d %s; want 200 (the second settlement gave back what it needed)",
			long.status, long.body)
	}
	h.settled()
	chargedOrReleased(t, h.holdsOf(u.ID), "each call charged and each small hold released at 0")
}
