package proxy_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestPausedForwardedCallWhoseSettlementFailedIsRefunded: a call forwarded before its process
// was stopped, and stopped past its hold's life with its answer whole (its lease lapsed), finds
// its hold charged what it held by a peer's reconciler (reconcile_hold); resumed, its own
// settlement fails (the database out of reach for all its settle_timeout). It was never paid
// under a pause (paidUnderPause: it was forwarded before), yet its hold may have been charged:
// it has lived as long as the soonest such a charge (mayBeChargedUnderAPause), and what it did
// not use of that charge is given back (refundAfterFailedSettlement), as its settlement, had it
// committed, would have found and given it back. Mutant: only a call paid under a pause read
// again after a failed settlement (the whole hold kept for a call that used a hundredth of it).
func TestPausedForwardedCallWhoseSettlementFailedIsRefunded(t *testing.T) {
	const holdTTL = 2 * time.Second
	h := newHarness(t, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval = holdTTL, time.Second
		c.Limits.SettleTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	ctx := context.Background()
	// What the call costs unpaused: its own settlement's charge.
	used, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	before, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	reached, let := make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(let) }) }
	t.Cleanup(resume)
	var final, settling atomic.Bool
	h.srv.ObserveSteps(func(sctx context.Context, step string) {
		switch {
		case step == "answer final" && final.CompareAndSwap(false, true):
			close(reached)
			<-let // the process stopped, its answer whole, before its settlement
		case step == "settle" && settling.CompareAndSwap(false, true):
			<-sctx.Done() // the database out of reach for all the settlement's time
		}
	})
	type answer struct {
		status int
		runID  string
	}
	done := make(chan answer, 1)
	sent := time.Now()
	go func() {
		resp := h.post(key, "/v1/chat/completions", streamBody, nil)
		defer resp.Body.Close()
		readAll(t, resp.Body)
		done <- answer{resp.StatusCode, resp.Header.Get(proxy.RunIDHeader)}
	}()
	runID, charged := chargedThroughItsPause(t, h, u.ID, reached, "its answer's end", sent, holdTTL)
	resume()
	var a answer
	select {
	case a = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after the resume")
	}
	h.settled()
	if a.status != 200 || a.runID != runID || !settling.Load() || used.ChargedMicro <= 0 || used.ChargedMicro >= charged {
		t.Fatalf("the scene did not happen: %d (run %q, paused %s), settlement held %v; the call costs %d µUSD, its hold %d",
			a.status, a.runID, runID, settling.Load(), used.ChargedMicro, charged)
	}
	costItsUseAlone(t, h, u.ID, runID, charged, used.ChargedMicro, before)
}
