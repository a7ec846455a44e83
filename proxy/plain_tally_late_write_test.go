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

// TestPlainCallsEarlyTallyDeliveredLateDoesNotUndoTheLaterOne: a plain stream is tallied at its
// final event (5 output tokens) with its fingerprint's release; that MULTI/EXEC reaches Redis
// only after the gateway gave up on it (testenv.RedisWriteLate). The provider reports 50 after
// [DONE]; the tally is set again, to 50, beside a settlement that fails (the database out of
// reach: a double fault). The early write then lands. Its figures must not replace the later
// write's: the reconciler settles the run from the tally, and charged the final event's 5
// output tokens of the 50 reported. The call's writes are numbered, and Redis keeps the
// highest (runstate.Tally.RecordCallWith).
func TestPlainCallsEarlyTallyDeliveredLateDoesNotUndoTheLaterOne(t *testing.T) {
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	h, lossy := newLateRedisHarness(t, harnessSetup{db: testenv.Open(t, dsn)}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t)
		c.Limits.SettleTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	final, resume := h.holdAtFirst("answer final")
	// The call's first write naming a tally: the one that gives its fingerprint back.
	lossy.Arm(h.keys.Prefix+"billing:usage:{", testenv.RedisWriteLate, 1)
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	<-final // its tally, at the final event, sent and held late
	lossyDB.TakeDown()
	resume()
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled() // the settlement has given up; the tally set again to the report's figures
	lossyDB.Restore()
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Usage.Output != 50 {
		t.Fatalf("tally %+v found=%v err=%v before the early write lands: want the 50 output tokens reported", tl, found, err)
	}
	if n := deliverAllLate(t, lossy); n != 1 {
		t.Fatalf("%d tally writes held late, want the final event's one", n)
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
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.ChargedMicro {
		t.Fatalf("tally %+v found=%v err=%v: want the call once, as charged (%d µUSD)", tl, found, err, r.ChargedMicro)
	}
}
