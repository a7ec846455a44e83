package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestStalledRedisRefusesCallsWithinBound: the Redis steps on a call's path before it is
// forwarded (the fingerprint window, an Idempotency-Key's record, a named run's reservation,
// the records of the earlier answers a request continues) end at the gateway's own bound (redisStepTimeout), not at the Redis client's read timeout
// (3 s by default, none with read_timeout=-1 in REDIS_URL): a caller holding a hold and a
// max_in_flight slot waited that long for its 503 each time Redis hung. Each is refused with its 503, nothing
// forwarded, and its hold released (the ledger check at cleanup).
//
// The client here has no read timeout (read_timeout=-1), and the call's admission budget
// (admit_timeout, which bounds every step before forwarding too) is set past the test's
// deadline: a step without the gateway's own bound never ends, and the test's deadline, far
// past that bound, tells the two apart. (With the default admit_timeout of 5 s, the steps
// ended at it with redisStep's bound gone, and the test passed.) A bound that grew (a step of
// 15 s) is told by a check at two and a half times the longest one.
func TestStalledRedisRefusesCallsWithinBound(t *testing.T) {
	// Ten times the longest bound: a hang, not a measure.
	const hang = 40 * time.Second
	var stalled atomic.Bool
	h := newHarnessOn(t, harnessSetup{contextTimeouts: true, redisReadTimeout: -1,
		redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return &testenv.StallingConn{Conn: c, Stalled: &stalled} })},
		func(c *config.Config) { c.Limits.AdmitTimeout = hang + 10*time.Second })
	_, key := h.user("standard")
	stalled.Store(true)
	cases := []struct {
		name string
		hdr  map[string]string
		code string
		path string // "" for chatBody on /v1/chat/completions
		body string
	}{
		// One step of redisStepTimeout (2 s).
		{"plain call", nil, "dedup_unavailable", "", ""},
		{"Idempotency-Key", map[string]string{"Idempotency-Key": "stall-1"}, "dedup_unavailable", "", ""},
		// The reservation, then its release (the tally's own 2 s) before the refusal is sent.
		{"named run", map[string]string{"X-Run-Id": "stall-run"}, "billing_unavailable", "", ""},
		// The lookup of the earlier answer's records (recordLookupTimeout), then one step.
		{"continuation", nil, "dedup_unavailable", "/v1/responses", `{"model":"fake-gpt","previous_response_id":"resp_stall","input":"Go on."}`},
	}
	// Two and a half times the longest bound (the named run's, 4 s): room for a loaded machine.
	const grown = 10 * time.Second
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls := h.fake.Calls()
			ctx, cancel := context.WithTimeout(context.Background(), hang)
			defer cancel()
			path, body := "/v1/chat/completions", chatBody
			if tc.path != "" {
				path, body = tc.path, tc.body
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("not answered within %v with Redis stalled (a step without the gateway's bound): %v", hang, err)
			}
			out := readAll(t, resp.Body)
			resp.Body.Close()
			if took := time.Since(start); took > grown {
				t.Errorf("refused after %v with Redis stalled: the gateway's bound on a step grew past %v", took.Round(time.Millisecond), grown)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, out) != tc.code {
				t.Errorf("%d %s, want 503 %s", resp.StatusCode, out, tc.code)
			}
			if h.fake.Calls() != calls {
				t.Errorf("the call was forwarded with Redis stalled")
			}
		})
	}
	stalled.Store(false) // a named run's tally is retried for settle_timeout
	if t.Failed() {
		return // a step left hanging would hang the wait for settlements too
	}
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
