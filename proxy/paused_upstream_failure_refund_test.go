package proxy_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPausedCallWhoseUpstreamFailedIsRefunded: a call the pause caught between its hold's
// COMMIT and its forward, its hold charged what it held by a peer's reconciler
// (reconcile_hold), is forwarded once resumed (paidUnderAPause), and the upstream refuses it
// (a 5xx: nothing billed, nothing produced). Unpaused, such a call is settled at 0
// (upstream_error), and its caller's SDK retries it; paused, its own settlement at 0 found the
// hold settled and changed nothing: the caller paid all its hold held for a 5xx, and its retry
// paid again. The charge is given back as a call never forwarded's is (refundPausedCharge).
//
// The pause is stood in for by holding the call at its attempt's admission (an Idempotency-Key
// call: the one step between a plain call's hold and its forward a test can hold it at) past
// hold_ttl and admit_timeout, its hold settled under it as the reconciler settles it.
//
// settlement's time spent: the settlement that found the hold settled took all its
// settle_timeout (a database stall), and the refund has a deadline of its own: on the
// settlement's, it was lost, an error line its only trace.
//
// settlement failed: the call's own settlement gave up (the database out of reach, resumed,
// for all its settle_timeout) and left the run to the reconciler, which never reads a settled
// run again: the tally the call wrote lies unread, and the refund was never tried. A call that
// may have been paused past its hold tries it after a failed settlement too, with a deadline
// of its own.
func TestPausedCallWhoseUpstreamFailedIsRefunded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// spent: the settlement's deadline passes before the refund starts; settleFails: the
		// settlement fails, its deadline passed before it is sent.
		spent, settleFails bool
	}{{"refunded", false, false}, {"settlement's time spent", true, false}, {"settlement failed", false, true}} {
		t.Run(tc.name, func(t *testing.T) { pausedCallWhoseUpstreamFailed(t, tc.spent, tc.settleFails) })
	}
}

// pausedCallWhoseUpstreamFailed is TestPausedCallWhoseUpstreamFailedIsRefunded's case; spent
// holds the refund until its settlement's deadline has passed, settleFails the settlement.
func pausedCallWhoseUpstreamFailed(t *testing.T, spent, settleFails bool) {
	h, holdTTL := pausedHarness(t, func(c *config.Config) { c.Limits.SettleTimeout = 2 * time.Second })
	u, key := h.user("standard")
	ctx := context.Background()
	before, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	reached, let := make(chan struct{}), make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(let) }) }
	t.Cleanup(resume)
	var first atomic.Bool
	h.srv.ObserveSteps(func(sctx context.Context, step string) {
		switch {
		case step == "attempt admitted" && first.CompareAndSwap(false, true):
			close(reached)
			<-let
		case step == "refund" && spent, step == "settle" && settleFails:
			<-sctx.Done()
		}
	})
	type answer struct {
		status int
		runID  string
		body   []byte
	}
	done := make(chan answer, 1)
	sent := time.Now()
	go func() {
		resp := h.post(key, "/v1/chat/completions", streamBody, map[string]string{
			proxy.IdempotencyKeyHeader: "paused-then-5xx", fakellm.HeaderStatus: "503"})
		defer resp.Body.Close()
		done <- answer{resp.StatusCode, resp.Header.Get(proxy.RunIDHeader), readAll(t, resp.Body)}
	}()
	runID, charged := chargedThroughItsPause(t, h, u.ID, reached, "its attempt's admission", sent, holdTTL)
	calls := h.fake.Calls()
	resume()
	var a answer
	select {
	case a = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after the resume")
	}
	h.settled()
	if h.fake.Calls() != calls+1 || a.status < 500 || a.runID != runID {
		t.Fatalf("the scene did not happen: %d %s (run %q, paused %s), %d upstream calls after the resume, want the paid call forwarded and refused 5xx",
			a.status, a.body, a.runID, runID, h.fake.Calls()-calls)
	}
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != charged {
		t.Fatalf("the reconciler's settlement changed: %s charged %d", r.SettleSource.String, r.ChargedMicro)
	}
	refunded := grantedTo(t, h, u.ID)
	if refunded != charged {
		t.Errorf("granted back %d µUSD for a call its upstream refused (charged %d for it; unpaused, it costs 0)", refunded, charged)
	}
	after, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.AvailableMicro != before.AvailableMicro {
		t.Errorf("available %d µUSD after a call its upstream refused, %d before it", after.AvailableMicro, before.AvailableMicro)
	}
}
