package proxy_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestHoldsExpireAfterTheirOwnTTL: a plain call's hold expires hold_ttl after its admission,
// and a named run's run_ttl after its last call (DESIGN §3.3, §4): the reconciler takes over a
// call at its hold's expiry, and a run's expiry is what its idle time is measured against. The
// two are 15 minutes each by default, so a swap of them passed every other test.
func TestHoldsExpireAfterTheirOwnTTL(t *testing.T) {
	const holdTTL, runTTL = 8 * time.Minute, 13 * time.Minute
	h := newHarness(t, func(c *config.Config) { c.Holds.HoldTTL, c.Holds.RunTTL = holdTTL, runTTL })
	_, key := h.user("standard")
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		ttl  time.Duration
	}{
		{"plain call", nil, holdTTL},
		{"named run", map[string]string{"X-Run-Id": "ttl-run"}, runTTL},
	} {
		resp := h.post(key, "/v1/chat/completions", chatBody, tc.hdr)
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", tc.name, resp.StatusCode)
		}
		var micros int64
		if err := h.db.Get(&micros, "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) FROM run_holds WHERE run_id = ?",
			resp.Header.Get(proxy.RunIDHeader)); err != nil {
			t.Fatal(err)
		}
		lived := time.Duration(micros) * time.Microsecond
		// The expiry is counted from the admission's clock, read as its transaction starts, a
		// moment before the row's created_at; a named run's is pushed out by its call's record
		// a moment after.
		if lived < tc.ttl-time.Second || lived > tc.ttl+time.Minute {
			t.Errorf("%s: expires %v after it was created, want %v", tc.name, lived, tc.ttl)
		}
	}
}
