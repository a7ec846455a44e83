package proxy_test

import (
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestStalledRedisRefusesCallsWithinBound: the Redis steps on a call's path before it is
// forwarded (the fingerprint window, an Idempotency-Key's record, a named run's reservation)
// end at the gateway's own bound (redisStepTimeout), not at the Redis client's read timeout
// (3 s by default, none with read_timeout=-1 in REDIS_URL): a caller holding a hold and a
// max_in_flight slot waited that long for its 503 each time Redis hung. Each is refused with its 503, nothing
// forwarded, and its hold released (the ledger check at cleanup).
func TestStalledRedisRefusesCallsWithinBound(t *testing.T) {
	var stalled atomic.Bool
	h := newHarnessOn(t, harnessSetup{contextTimeouts: true,
		redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return &testenv.StallingConn{Conn: c, Stalled: &stalled} })}, nil)
	_, key := h.user("standard")
	stalled.Store(true)
	cases := []struct {
		name  string
		hdr   map[string]string
		code  string
		bound time.Duration
	}{
		// One step of redisStepTimeout (2 s), with room; unbounded, 5 s.
		{"plain call", nil, "dedup_unavailable", 3 * time.Second},
		{"Idempotency-Key", map[string]string{"Idempotency-Key": "stall-1"}, "dedup_unavailable", 3 * time.Second},
		// The reservation, then its release (the tally's own 2 s) before the refusal is sent;
		// unbounded, 7 s.
		{"named run", map[string]string{"X-Run-Id": "stall-run"}, "billing_unavailable", 5 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := h.fake.Calls()
			start := time.Now()
			resp := h.post(key, "/v1/chat/completions", chatBody, tc.hdr)
			out := readAll(t, resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			t.Logf("refused after %v", took.Round(time.Millisecond))
			if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, out) != tc.code {
				t.Errorf("%d %s, want 503 %s", resp.StatusCode, out, tc.code)
			}
			if took > tc.bound {
				t.Errorf("refused after %v with Redis stalled, want within %v", took.Round(time.Millisecond), tc.bound)
			}
			if h.fake.Calls() != calls {
				t.Errorf("the call was forwarded with Redis stalled")
			}
		})
	}
	stalled.Store(false) // a named run's tally is retried for settle_timeout
	h.settled()
	// A named run stays open for the agent's retry (README: 503 billing_unavailable); the
	// other two calls' holds are released.
	var live int
	if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE state <> 'settled' AND client_run_id IS NULL"); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Errorf("%d holds of refused calls left open", live)
	}
}
