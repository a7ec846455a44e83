package proxy_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallGivesItsFingerprintBackWhenItsTallyWriteIsLost: a plain call's fingerprint is
// given back in the tally's MULTI/EXEC (tallyWithFingerprint), which go-redis does not resend.
// Whether that write's reply or the write itself is lost with the connection, the fingerprint
// must be gone by the time the caller has the end of its answer (README: "After it finished"
// starts when the answer's last byte is on its way), and the call tallied once and charged
// once: a write lost before it reached Redis is written again beside the settlement, and one
// whose reply was lost, written again so, still counts the call once (its figures set, not
// added: runstate.Tally.RecordCallWith). Left in place, the same request sent at once is refused 409 duplicate of a run
// whose answer the caller already has, until that run's settlement commits.
func TestPlainCallGivesItsFingerprintBackWhenItsTallyWriteIsLost(t *testing.T) {
	for _, c := range []struct {
		name    string
		loss    testenv.RedisLoss
		tallied bool // the tally holds the call: the write reached Redis, or its later try did
	}{
		{"reply lost", testenv.RedisReplyLost, true},
		{"request lost", testenv.RedisRequestLost, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
			u, key := h.user("standard")
			// The call's first write naming a tally: the one that gives the fingerprint back.
			lossy.Arm(h.keys.Prefix+"billing:usage:{", c.loss, 1)
			resp, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"})
			if lossy.Fired() != 1 {
				t.Fatalf("%d tally writes lost, want 1", lossy.Fired())
			}
			// The answer is whole: its fingerprint must be gone, whatever the settlement does.
			fps, err := h.rdb.Keys(context.Background(), h.keys.Prefix+"dedup:{"+strconv.FormatUint(u.ID, 10)+"}:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(fps) != 0 {
				t.Fatalf("fingerprint %v still held after the caller has its whole answer", fps)
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			r := h.run(u.ID, runID)
			if r.ChargedMicro != fakeGPTCost(r.InTok, 5) {
				t.Fatalf("run %+v: want the call charged once", r)
			}
			tl, found, err := h.tally.Get(context.Background(), runID)
			if err != nil || found != c.tallied || (found && (tl.Calls != 1 || tl.CostMicro != r.ChargedMicro)) {
				t.Fatalf("tally %+v (found %v, %v): want the call once, found %v", tl, found, err, c.tallied)
			}
			// The same request again, now that the first is settled, runs.
			h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderChunks: "5"}) // the same request after the first ended
		})
	}
}

// TestFingerprintClaimWhoseEveryReplyWasLostRefusesAndFreesTheRetry: the SET NX that claims a
// plain request's fingerprint reaches Redis on every try, and every reply is lost: the request
// is refused 503 dedup_unavailable (not run, its hold released at 0) though its claim stands in
// Redis. The caller's retry, once that refusal has settled, must run — the fingerprint names a
// run that ended — and be charged once; it must not be refused 409 duplicate of a request that
// never ran. (A request that never reached Redis is TestFingerprintWithRedisDown.)
func TestFingerprintClaimWhoseEveryReplyWasLostRefusesAndFreesTheRetry(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	attempts := h.rdb.Options().MaxRetries + 1
	lossy.Arm(h.keys.Prefix+"dedup:{", testenv.RedisReplyLost, attempts)
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "dedup_unavailable" {
		t.Fatalf("claim with every reply lost: %d %s, want 503 dedup_unavailable", resp.StatusCode, body)
	}
	if lossy.Fired() != attempts {
		t.Fatalf("%d claim replies lost, want every attempt, %d", lossy.Fired(), attempts)
	}
	h.settled()
	if n := h.fake.Calls(); n != 0 {
		t.Fatalf("%d upstream calls for the refused request, want 0", n)
	}
	again, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, nil) // retry after the refusal settled
	h.settled()
	h.expectCharges(u.ID, []string{again.Header.Get(proxy.RunIDHeader)}, holds.SourceRelease)
}
