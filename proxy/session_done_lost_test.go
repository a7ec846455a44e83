package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionCallEndMarkLostOnceIsStillMade: a session's call marks its end (sessdone) before
// its answer's end goes out, so the same message sent at once (a regenerate) runs rather than
// being refused already_running while the settlement is on its way. The mark is a lone SET,
// which go-redis sends again when its reply, or the write itself, is lost once: the mark must
// be there when the caller has its answer, and the regenerate run, each call charged once.
func TestSessionCallEndMarkLostOnceIsStillMade(t *testing.T) {
	for _, c := range []struct {
		name string
		loss testenv.RedisLoss
	}{
		{"reply lost", testenv.RedisReplyLost},
		{"request lost", testenv.RedisRequestLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
			u, key := h.user("standard")
			session := map[string]string{proxy.SessionHeader: "chat-" + testenv.RandomID(4)}
			lossy.Arm(h.keys.Prefix+"sessdone:{", c.loss, 1)
			first := send(h.gw.URL, key, chatBody, session)
			if first.status != http.StatusOK || lossy.Fired() != 1 {
				t.Fatalf("first: %d %s, %d end marks lost; want 200 and 1", first.status, first.body, lossy.Fired())
			}
			runID := first.header.Get(proxy.RunIDHeader)
			// Read before the settlement is awaited: the mark precedes the answer's end.
			if n, err := h.rdb.Exists(context.Background(), h.keys.SessionDone(runID)).Result(); err != nil || n != 1 {
				t.Fatalf("end mark of the answered call: exists %d (%v), want it written", n, err)
			}
			again := sendOK(t, "regenerate after the answer", h.gw.URL, key, chatBody, session)
			h.settled()
			h.expectCharges(u.ID, []string{runID, again.header.Get(proxy.RunIDHeader)})
		})
	}
}
