package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestPausedCallKilledBeforeItsRefundIsRefundedByTheReconciler: a call the pause caught between
// its hold's COMMIT and its forward has its hold charged what it held by a peer's reconciler
// (reconcile_hold); resumed, it is forwarded, used what it used and wrote its tally, and its
// own settlement found the run settled. Its process refunds the difference by a grant keyed
// pause-refund:{run_id}; killed before that grant (or before its settlement, its tally
// written), the whole hold stayed charged: the reconciler never read a settled run again, and
// the call's tally lay unread. A later pass reads it and grants the difference: the user ends
// charged what the call used — what the same call, unpaused, is charged — once.
//
// The kill is stood in for by holding the process at the step ("refund" or "settle") while the
// pass runs with no lease alive (a killed process's lapses). The process is then let go, as
// one that was only slow: its own refund finds the pass's grant and pays nothing more. "not
// killed": the process refunds first, and the pass after it pays nothing more either.
// "upstream failed": the call, forwarded once resumed, was refused 5xx by its upstream (settled
// at 0 unpaused): its zero tally has the pass give back the whole charge.
func TestPausedCallKilledBeforeItsRefundIsRefundedByTheReconciler(t *testing.T) {
	for _, tc := range []struct {
		name, killedAt string
		upstreamFails  bool
	}{{"killed at refund", "refund", false}, {"killed at settle", "settle", false}, {"not killed", "", false},
		{"upstream failed, killed at refund", "refund", true}} {
		t.Run(tc.name, func(t *testing.T) { pausedCallKilledBeforeItsRefund(t, tc.killedAt, tc.upstreamFails) })
	}
}

func pausedCallKilledBeforeItsRefund(t *testing.T, killedAt string, upstreamFails bool) {
	h, holdTTL := pausedHarness(t, func(c *config.Config) { c.Limits.SettleTimeout = 2 * time.Second })
	u, key := h.user("standard")
	ctx := context.Background()

	headers := func(idemKey string) map[string]string {
		hdr := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
		if upstreamFails {
			hdr[fakellm.HeaderStatus] = "503"
		}
		return hdr
	}
	// Answered whole, or refused by the gateway for its upstream's 5xx.
	answered := func(status int) bool { return status == http.StatusOK || (upstreamFails && status >= 500) }
	// The same call, unpaused: what the paused one must end charged.
	ref := h.post(key, "/v1/chat/completions", streamBody, headers("unpaused"))
	refRun := ref.Header.Get(proxy.RunIDHeader)
	readAll(t, ref.Body)
	ref.Body.Close()
	h.settled()
	used := h.run(u.ID, refRun).ChargedMicro
	if !answered(ref.StatusCode) || (used <= 0) != upstreamFails {
		t.Fatalf("the unpaused call: %d, run %q charged %d", ref.StatusCode, refRun, used)
	}
	before, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}

	reached, let := make(chan struct{}), make(chan struct{})
	killed, revive := make(chan struct{}), make(chan struct{})
	var letOnce, reviveOnce sync.Once
	resume := func() { letOnce.Do(func() { close(let) }) }
	reviveAll := func() { reviveOnce.Do(func() { close(revive) }) }
	t.Cleanup(resume)
	t.Cleanup(reviveAll)
	var first, kill atomic.Bool
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch {
		case step == "attempt admitted" && first.CompareAndSwap(false, true):
			close(reached)
			<-let
		case killedAt != "" && step == killedAt && kill.CompareAndSwap(false, true):
			close(killed)
			<-revive
		}
	})
	done := make(chan int, 1)
	sent := time.Now()
	var runID atomic.Value
	go func() {
		resp := h.post(key, "/v1/chat/completions", streamBody, headers("paused"))
		defer resp.Body.Close()
		runID.Store(resp.Header.Get(proxy.RunIDHeader))
		readAll(t, resp.Body)
		done <- resp.StatusCode
	}()
	paused, charged := chargedThroughItsPause(t, h, u.ID, reached, "its attempt's admission", sent, holdTTL)
	if charged <= used {
		t.Fatalf("the hold charged %d, the call uses %d: no refund to make", charged, used)
	}
	resume()
	select {
	case status := <-done:
		if !answered(status) {
			t.Fatalf("the paused call answered %d after the resume", status)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after the resume")
	}
	if got, _ := runID.Load().(string); got != paused {
		t.Fatalf("the answer names run %q, the paused hold is %s", got, paused)
	}
	if killedAt != "" {
		select {
		case <-killed:
		case <-time.After(20 * time.Second):
			t.Fatalf("the process never reached its %s", killedAt)
		}
	} else {
		h.settled()
	}
	// The call's tally is written beside its settlement: the pass comes once it is there.
	waitFor(t, "the paused call's tally", func() bool {
		_, found, err := h.tally.Get(ctx, paused)
		return err == nil && found
	})

	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally}, Leases: noLeases{},
		Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute, RefundWindow: time.Hour})
	if st, err := rec.RunOnce(ctx); err != nil {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	wantRefund := charged - used
	grants := func() []int64 {
		var g []int64
		if err := h.db.Select(&g, "SELECT amount_micro FROM grants WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := grants(); len(g) != 1 || g[0] != wantRefund {
		t.Errorf("after the pass, grants %v µUSD; want one of %d (the hold's %d less the %d the call used)", g, wantRefund, charged, used)
	}

	// The process, only slow after all, goes on: its refund is the pass's grant again.
	reviveAll()
	h.settled()
	if _, err := rec.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if g := grants(); len(g) != 1 || g[0] != wantRefund {
		t.Errorf("after the process's own refund and another pass, grants %v µUSD; want the one of %d", g, wantRefund)
	}
	if r := h.run(u.ID, paused); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != charged {
		t.Errorf("the reconciler's settlement changed: %s charged %d", r.SettleSource.String, r.ChargedMicro)
	}
	after, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if spent := before.AvailableMicro - after.AvailableMicro; spent != used {
		t.Errorf("the paused call cost its user %d µUSD in the end; the same call unpaused costs %d", spent, used)
	}
}
