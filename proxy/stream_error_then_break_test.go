package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestStreamEndedByTheProvidersErrorThenBrokenSaysNoMore: the provider's own error event ends
// the answer for its caller, as a final event does; what the upstream's connection does after
// it (a chunked body cut before its last chunk, here) is no break of the answer. The caller
// gets the stream as the provider sent it, its error event last, and the call settles
// stream_error once. Read as a break, a gateway upstream_broken event followed the provider's
// error, a second end of an answer that had ended.
func TestStreamEndedByTheProvidersErrorThenBrokenSaysNoMore(t *testing.T) {
	const stream = hostileChunk +
		"data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		// Chunked, and closed without its last chunk: the gateway reads a broken body, not
		// its end.
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(stream), stream)
		_ = bw.Flush()
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "up", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	status, got, run := h.postRun(u.ID, key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if status != http.StatusOK || string(got) != stream {
		t.Errorf("%d %q,\nwant 200 and the provider's stream as it came, its error event last", status, got)
	}
	if strings.Contains(string(got), "upstream_broken") {
		t.Errorf("the gateway said the stream broke after the provider's error event had ended it: %q", got)
	}
	if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceStreamError {
		t.Errorf("settled %s %s, want stream_error", run.State, run.SettleSource.String)
	}
}
