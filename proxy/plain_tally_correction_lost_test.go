package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

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
