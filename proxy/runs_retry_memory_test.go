package proxy_test

import (
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestRunTallyRetryDoesNotKeepRequestBodies: while Redis is out of reach, every call of
// a named run ends with a tally that failed, and a goroutine retries it for settle_timeout,
// outside the settleSlots bound, holding the whole call — its request body included, twice
// (the call's model string is a window into gjson's copy of the body). A
// caller sending large bodies under X-Run-Id (later calls of a run are not limited by
// max_in_flight at admission: that limit is the Redis reservation, which is down) makes the
// gateway hold every body for settle_timeout.
func TestRunTallyRetryDoesNotKeepRequestBodies(t *testing.T) {
	var down atomic.Bool
	h := newHarnessOn(t, harnessSetup{redisDialer: wrappedDialer(func(c net.Conn) net.Conn { return blipConn{c, &down} })},
		func(c *config.Config) { c.Limits.SettleTimeout = 6 * time.Second })
	_, key := h.user("standard")
	pad := strings.Repeat("x", 2<<20)
	body := `{"model":"fake-gpt","max_tokens":5,"messages":[{"role":"user","content":"` + pad + `"}]}`
	// The run exists (first call while Redis answers).
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "big-task"})
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	down.Store(true)
	defer down.Store(false)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	const calls = 40
	for range calls {
		resp := h.post(key, "/v1/chat/completions", body, map[string]string{"X-Run-Id": "big-task"})
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("call with Redis down: %d, want 503", resp.StatusCode)
		}
	}
	// Every call has ended (its finish, which starts the tally's retries, runs before).
	waitFor(t, "the calls to end", func() bool { return h.metric("tollgate_active_calls") == "0" })
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("after %d refused calls of 2 MiB: heap +%d MiB, goroutines %d -> %d", calls, grown>>20, g0, runtime.NumGoroutine())
	if grown > 20<<20 {
		t.Fatalf("%d calls refused at once keep %d MiB of heap alive: their request bodies wait in tally retries", calls, grown>>20)
	}
}
