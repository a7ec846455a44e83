package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallWhoseTallyReplyWasLostIsTalliedOnce: a plain call's tally goes out with the
// release of its fingerprint, once its answer is whole (a MULTI/EXEC, which go-redis does not
// resend). Redis runs it and the reply is lost: the call is tallied, though the gateway cannot
// know it, and its later try beside the settlement must not count it again (it sets the call's
// figures, not adds them: runstate.Tally.RecordCallWith). Added again, the run's tally counted
// the call twice at twice its cost, and the reconciler, should the settlement fail, charged that.
func TestPlainCallWhoseTallyReplyWasLostIsTalliedOnce(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	// The call's first write naming a tally: nothing before it reads or writes one.
	lossy.Arm(h.keys.Prefix+"billing:usage:{", testenv.RedisReplyLost, 1)
	resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"})
	runID := resp.Header.Get(proxy.RunIDHeader)
	r := h.run(u.ID, runID)
	if lossy.Fired() != 1 {
		t.Fatalf("%d tally replies lost, want 1", lossy.Fired())
	}
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != r.ChargedMicro || r.ChargedMicro != fakeGPTCost(r.InTok, 5) {
		t.Fatalf("tally %+v (found %v, %v) of a call charged %d µUSD: want the call once", tl, found, err, r.ChargedMicro)
	}
}

// TestNamedRunCallWhoseTallyWasLostIsCountedByItsRetry: a named run's call writes its tally
// before its answer ends (with the mark that its record on the run's row is to come); every
// attempt of that write is lost before it reaches Redis, and the call's record on the row
// lands. The call's end writes the tally again, and that retried write counts the call as the
// row does — one call at its cost: a tally with fewer calls than the row reads as one a Redis
// restart emptied, and the run's settle is refused 409 run_busy, then charges no call.
func TestNamedRunCallWhoseTallyWasLostIsCountedByItsRetry(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-warm"}, 5)
	runID := proxy.RunIDFor(u.ID, "task-tally-lost")
	attempts := h.rdb.Options().MaxRetries + 1
	// The release script alone names the run's lost mark (the reservation names the call's
	// done mark too).
	lossy.Arm(h.keys.Lost(runID), testenv.RedisRequestLost, attempts)
	h.postOK(t, key, "/v1/chat/completions", chatBody, with(map[string]string{"X-Run-Id": "task-tally-lost"}, fakellm.HeaderChunks, "5"))
	h.settled()
	if lossy.Fired() != attempts {
		t.Fatalf("%d tally writes lost, want every attempt of the first, %d", lossy.Fired(), attempts)
	}
	row := h.run(u.ID, runID)
	tl, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 1 || tl.CostMicro != row.CostMicro || row.Calls != 1 || row.CostMicro == 0 {
		t.Fatalf("tally %+v (found %v, %v), row %d calls at %d µUSD: want the one call in both", tl, found, err, row.Calls, row.CostMicro)
	}
	if status, body := h.settleRun(key, "task-tally-lost"); status != http.StatusOK {
		t.Fatalf("settle after the call ended: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 1 || r.ChargedMicro != fakeGPTCost(r.InTok, 5) {
		t.Fatalf("run %+v: want settled with its one call charged", r)
	}
}
