package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestAnthropicOverloadedAfterMessageStartPaysNothing: Anthropic opens a stream with
// message_start, whose usage counts the prompt and a placeholder output of 1, and may then fail
// with an error event (overloaded_error, the 529 of a stream) before any content. Anthropic
// does not bill a failed request; that message_start is no report of work done. Read as one,
// the call was charged its whole prompt and an estimated token for a failure.
func TestAnthropicOverloadedAfterMessageStartPaysNothing(t *testing.T) {
	start := `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: "+start+"\n\n"+
			"event: ping\ndata: {\"type\": \"ping\"}\n\n"+
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "up", Kind: "anthropic", BaseURL: up.URL, Models: []string{"claude-test"}}}
	})
	u, key := h.user("standard")
	body := `{"model":"claude-test","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`
	resp := h.post(key, "/v1/messages", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(got), "overloaded_error") {
		t.Fatalf("the caller did not get the provider's error: %q", got)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
		t.Fatalf("the provider failed after message_start, before any output; settled %s %s, charged %d µUSD (in_tok=%d out_tok=%d): want upstream_error at 0",
			run.State, run.SettleSource.String, run.ChargedMicro, run.InTok, run.OutTok)
	}
}
