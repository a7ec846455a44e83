package proxy_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestKeepAliveOnlyStreamIsBroken: a stream whose upstream sent only keep-alive comments
// (": OPENROUTER PROCESSING", a router's wait for its provider) and then closed has no answer,
// as a stream that ends before its first event has none: the caller is told the stream broke
// (upstream_broken), the call ends stream_error, and its Idempotency-Key is not pinned to the
// empty answer — a retry with the key runs again rather than replaying nothing for a day.
func TestKeepAliveOnlyStreamIsBroken(t *testing.T) {
	var calls atomic.Int32
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		if n > 1 {
			fmt.Fprint(w, hostileChunk+hostileUsage+"data: [DONE]\n\n")
			return
		}
		for i := 0; i < 3; i++ {
			fmt.Fprint(w, ": OPENROUTER PROCESSING\n\n")
		}
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "k-keepalive"}
	resp := h.post(key, "/v1/chat/completions", streamBody, idem)
	got := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if !bytes.Contains(got, []byte("upstream_broken")) {
		t.Errorf("the caller got %q: a clean end of a stream with no answer, want an upstream_broken error event", got)
	}
	if run.SettleSource.String != string(holds.SourceStreamError) {
		t.Errorf("settled %q, want %q", run.SettleSource.String, holds.SourceStreamError)
	}
	resp = h.post(key, "/v1/chat/completions", streamBody, idem)
	again := readAll(t, resp.Body)
	resp.Body.Close()
	if !bytes.Contains(again, []byte("Hello billing team")) {
		t.Errorf("the retry with the same key got %q, want the answer of a new attempt", again)
	}
}
