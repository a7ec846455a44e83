package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestStreamOutlastingTheWriteTimeoutToAReadingCallerCompletes: limits.client_write_timeout
// bounds one stalled write, not the answer: a stream that lasts four times as long, to a caller
// that reads every event, is relayed whole and settled complete. A deadline set once, at the
// first write, and never moved on, would cut it as a caller that left.
func TestStreamOutlastingTheWriteTimeoutToAReadingCallerCompletes(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h := newHarness(t, func(c *config.Config) { c.Limits.ClientWriteTimeout = timeout })
	u, key := h.user("standard")
	// 24 events 50 ms apart: 1.2 s, four times the write timeout.
	resp := h.post(key, "/v1/chat/completions", streamBody, map[string]string{
		fakellm.HeaderChunks: "24", fakellm.HeaderChunkInterval: "50ms"})
	body := string(readAll(t, resp.Body))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s, want the stream's 200", resp.StatusCode, body)
	}
	if !strings.Contains(body, `"content":"tok24 "`) || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
		t.Fatalf("the stream did not reach its last event and [DONE] (client_write_timeout %v):\n%s", timeout, body)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.waitSettled(runID, 20*time.Second, "its stream ended")
	if r := h.run(u.ID, runID); r.SettleSource.String != holds.SourceComplete {
		t.Errorf("run settled by %q, want %q", r.SettleSource.String, holds.SourceComplete)
	}
}
