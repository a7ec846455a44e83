package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallsLateUsageReachesTheTallyInADoubleFault: a plain stream is tallied at its final
// event ([DONE], 5 output tokens reported) and the provider reports 50 after it. What the
// settlement finds beyond the tally goes to it beside the settlement; that write is lost (a
// Redis blip), and the database stays out of reach for longer than settle_timeout, so the
// reconciler settles the run from its tally. The tally must hold the call as its settlement
// would have charged it, 50 output tokens, as a failed first write's tries make it do
// (TestPlainCallInADoubleFaultIsChargedItsUsage): a correction written once and given up left
// the reconciler the final event's figures, and the call was charged 5 output tokens of 50.
func TestPlainCallsLateUsageReachesTheTallyInADoubleFault(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h, lossy := newLossyRedisHarness(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t)
		c.Limits.SettleTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	final, resume := h.holdAtFirst("answer final")
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	<-final // tallied with its fingerprint's release, at the final event
	// The next write naming the call's tally (what the settlement found beyond it), in a
	// MULTI/EXEC go-redis does not resend, is lost before it reaches Redis: a blip.
	lossy.Arm(h.keys.Usage(runID), testenv.RedisRequestLost, 1)
	// The database goes out of reach for the whole settlement.
	lossyDB.TakeDown()
	resume()
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled() // the settlement has given up; the tally's tries have landed or given up
	lossyDB.Restore()
	if lossy.Fired() != 1 {
		t.Fatalf("%d tally writes lost after the final event, want 1", lossy.Fired())
	}
	if got := h.run(u.ID, runID); got.State == holds.StateSettled {
		t.Fatalf("run settled with the database out of reach: %+v", got)
	}

	h.reconcileExpired(t, "run_id = ?", runID)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.OutTok != 50 ||
		r.ChargedMicro != fakeGPTCost(10, 50) {
		t.Fatalf("run %s settled as %s by %q, charged %d µUSD (%d in, %d out tokens); want the 50 output tokens reported, %d µUSD",
			runID, r.State, r.SettleSource.String, r.ChargedMicro, r.InTok, r.OutTok, fakeGPTCost(10, 50))
	}
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.Calls != 1 {
		t.Fatalf("tally %+v found=%v err=%v: want the call counted once", tl, found, err)
	}
}

// TestPausedPlainCallsLateUsageReachesTheTallyTheRevisitRefundsFrom: a plain stream is tallied
// at its final event (5 output tokens reported) and the provider reports 50 after it, while its
// hold was charged whole by a peer's reconciler (reconcile_hold: the process stopped past the
// hold's life). The settlement finds the run settled and changes nothing; the process's refund
// of what the call did not use fails (the database out of reach), and what was metered after
// the final event is lost on its first write to the tally (Redis out of reach as long). The
// refund is then the reconciler's revisit, from the tally: it must read the call's 50 output
// tokens. The correction's tries used to stop once the settlement committed, applied or not:
// the revisit refunded on the final event's 5, and the user paid 45 output tokens less than
// the call used. The same call unpaused is what the paused one must end charged.
func TestPausedPlainCallsLateUsageReachesTheTallyTheRevisitRefundsFrom(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h, lossy := newLossyRedisHarness(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t)
		c.Limits.SettleTimeout = 5 * time.Second
	})
	defer lossyDB.Restore()
	u, key := h.user("standard")
	ctx := context.Background()
	const body = `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	ref := h.post(key, "/v1/chat/completions", body, nil)
	readAll(t, ref.Body)
	ref.Body.Close()
	used := h.run(u.ID, ref.Header.Get(proxy.RunIDHeader)).ChargedMicro
	if ref.StatusCode != http.StatusOK || used != fakeGPTCost(10, 50) {
		t.Fatalf("the unpaused call: %d, charged %d µUSD, want %d", ref.StatusCode, used, fakeGPTCost(10, 50))
	}
	before, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}

	var charged atomic.Int64
	var paused atomic.Value
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch {
		case step == "answer final" && paused.Load() == nil:
			// Tallied at the final event; the process was stopped here past its hold's life.
			runID, c, err := chargeRunningHoldAsTheReconciler(h, u.ID)
			if err != nil {
				t.Errorf("the paused call's hold: %v", err)
				return
			}
			charged.Store(c)
			paused.Store(runID)
			// Redis out of reach for the tally from here, until the settlement is back.
			lossy.Arm(h.keys.Usage(runID), testenv.RedisRequestLost, 1000)
		case step == "refund" && paused.Load() != nil:
			lossyDB.TakeDown()
		}
	})
	resp := h.post(key, "/v1/chat/completions", body, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	runID, _ := paused.Load().(string)
	if resp.StatusCode != http.StatusOK || runID == "" || resp.Header.Get(proxy.RunIDHeader) != runID {
		t.Fatalf("the paused call: %d, run %q; its hold charged at its final event: %q", resp.StatusCode, resp.Header.Get(proxy.RunIDHeader), runID)
	}
	// The settlement is back, its refund failed and its lease released (settle's last step:
	// the call no longer counted settling): Redis is back too.
	waitFor(t, "the paused call's settlement back", func() bool { return h.srv.SettlingCalls(u.ID) == 0 })
	if h.leases.Serving(runID) {
		t.Fatalf("run %s still leased once its settlement is back", runID)
	}
	lossy.Disarm()
	h.settled()
	lossyDB.Restore()
	if lossy.Fired() == 0 {
		t.Fatal("no tally write lost after the final event: the test's premise")
	}
	if g := grantsOf(t, h, u.ID); len(g) != 0 {
		t.Fatalf("grants %v before the revisit: the process's refund was to fail", g)
	}
	if tl, found, err := h.tally.Get(ctx, runID); err != nil || !found || tl.Usage.Output != 50 || tl.Calls != 1 {
		t.Errorf("tally %+v found=%v err=%v: want the call's 50 output tokens, counted once", tl, found, err)
	}

	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally}, Leases: leaseCheck{h},
		Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute, RefundWindow: time.Hour})
	if st, err := rec.RunOnce(ctx); err != nil {
		t.Fatalf("reconcile: %+v, %v", st, err)
	}
	want := charged.Load() - used
	if g := grantsOf(t, h, u.ID); len(g) != 1 || g[0] != want {
		t.Errorf("after the revisit, grants %v µUSD; want one of %d (the hold's %d less the %d the call used)", g, want, charged.Load(), used)
	}
	after, err := h.store.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if spent := before.AvailableMicro - after.AvailableMicro; spent != used {
		t.Errorf("the paused call cost its user %d µUSD in the end; the same call unpaused costs %d", spent, used)
	}
}

// grantsOf lists the amounts of the grants userID was given.
func grantsOf(t *testing.T, h *harness, userID uint64) []int64 {
	t.Helper()
	var g []int64
	if err := h.db.Select(&g, "SELECT amount_micro FROM grants WHERE user_id = ?", userID); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestPlainStreamIsTalliedAtItsFinalEvent: a plain call's stream is tallied with its
// fingerprint's release at its final event, before [DONE] goes out: a gateway killed then (the
// caller has its answer, the settlement is not written) leaves the reconciler the call's
// figures, not a run it can charge only its hold. Probed at the answer's end: the tally
// already holds what the usage chunk reported.
func TestPlainStreamIsTalliedAtItsFinalEvent(t *testing.T) {
	h := fixedAnswerHarness(t, true, hostileChunk+hostileUsage+"data: [DONE]\n\n")
	_, key := h.user("standard")
	final, resume := h.holdAtFirst("answer final")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	<-final
	tallied, found, err := h.tally.Get(context.Background(), runID)
	resume()
	readAll(t, resp.Body)
	if err != nil || !found || tallied.Usage.Output != 400 || tallied.CostMicro != fakeGPTCost(10, 400) {
		t.Errorf("tally of run %s at the answer's end: %+v found=%v err=%v; want the 400 output tokens reported, cost %d",
			runID, tallied, found, err, fakeGPTCost(10, 400))
	}
}
