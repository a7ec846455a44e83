package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIDHeaderSentTwiceIsRefused: the gateway's own headers name a call's run, its retries or
// its conversation; sent on more than one line, a name was read as its first, perhaps empty.
// A retry whose first Idempotency-Key line was empty ran as a plain call and was charged
// again, and a session message with an empty first X-Session-Id line replaced nothing. Each is
// refused 400 with its header's code, nothing held or forwarded.
func TestIDHeaderSentTwiceIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	for _, tc := range []struct{ header, code string }{
		{proxy.IdempotencyKeyHeader, "invalid_idempotency_key"},
		{proxy.SessionHeader, "invalid_session_id"},
		{"X-Run-Id", "invalid_run_id"},
	} {
		for _, lines := range [][]string{{"", "k-1"}, {"k-1", "k-2"}, {"k-1", "k-1"}} {
			t.Run(tc.header, func(t *testing.T) {
				holdsBefore, _ := h.holdCount()
				calls := h.fake.Calls()
				req := h.newRequest(key, "/v1/chat/completions", chatBody, nil)
				for _, v := range lines {
					req.Header.Add(tc.header, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				out := readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest || errorCode(t, out) != tc.code {
					t.Errorf("%s sent as %q: %d %s, want 400 %s", tc.header, lines, resp.StatusCode, out, tc.code)
				}
				if holdsAfter, _ := h.holdCount(); h.fake.Calls() != calls || holdsAfter != holdsBefore {
					t.Errorf("%s sent as %q reached the upstream (%d → %d calls) or took a hold (%d → %d holds)",
						tc.header, lines, calls, h.fake.Calls(), holdsBefore, holdsAfter)
				}
			})
		}
	}
	// Sent once it is served as before.
	if run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "k-once"}); run.RunID == "" {
		t.Error("a call with one Idempotency-Key line was not answered")
	}
}
