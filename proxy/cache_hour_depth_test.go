package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestLongCacheCheckOfADeeplyNestedBody: the one-hour cache check looks at every level of a
// /v1/messages body, before anything is held (so before any in-flight limit or charge).
// Walked level by level, each level's parse scanning everything below it, it costs time
// proportional to the body's size times its depth (up to maxJSONDepth): a 4 MiB body of
// bracket chains 10 000 deep took 20 s of CPU — the trap metering's maxContentDepth closes
// for the estimate. The check must still find a cache_control at the bottom, and answer at
// once.
//
// (The deadline is a watchdog, not a measurement: with the 16 MiB body here the check takes
// a fraction of a second of CPU — 5 to 9 s of a test run's time on a 2-core box with two
// CPU burners beside it, under the race detector — the level-by-level walk over a minute.
// It was 10 s, which such a box crossed in 6 runs of 30.)
func TestLongCacheCheckOfADeeplyNestedBody(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { // claude-test has no one-hour cache write price
		c.Limits.MaxBodyBytes = 16 << 20
		c.Limits.MaxEventBytes = 32 << 20
	})
	_, key := h.user("standard")
	const depth = 9_990 // within maxJSONDepth
	chain := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	chains := strings.Repeat(chain+",", (16<<20-3*len(chain))/(len(chain)+1))
	body := `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"metadata":{"x":[` +
		chains + strings.Repeat("[", depth-2) + `{"cache_control":{"type":"ephemeral","ttl":"1h"}}` + strings.Repeat("]", depth-2) + `]}}`
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		resp := h.post(key, "/v1/messages", body, nil)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		done <- answer{resp.StatusCode, string(b)}
	}()
	select {
	case a := <-done:
		if a.status != http.StatusBadRequest || !strings.Contains(a.body, "unpriced_option") {
			t.Fatalf("%d %s, want 400 unpriced_option", a.status, a.body)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("a 16 MiB body of nested brackets was still being checked for cache_control 45 s later")
	}
}
