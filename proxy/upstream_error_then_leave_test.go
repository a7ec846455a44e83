package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestCallerLeavingAfterTheUpstreamsErrorEventPaysNothing: a provider that fails right after
// its 200 says so in the stream (OpenAI's error chunk or `error` event, Anthropic's `error`
// event), with no output and no usage: settled at 0, upstream_error, as a non-2xx refusal is.
// The SDKs raise on that event and close the stream at once; when the caller's close reaches
// the gateway before the upstream's own end (an upstream that lingers after its error, or
// one that sends response.failed a moment later), the call was settled as the caller's
// cancel and charged its prompt's estimate for what the provider said was a failure.
func TestCallerLeavingAfterTheUpstreamsErrorEventPaysNothing(t *testing.T) {
	cases := []struct {
		name, kind, model, path, body, stream string
	}{
		{"chat error chunk", "openai", "fake-gpt", "/v1/chat/completions",
			`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`,
			"data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n"},
		{"responses error event", "openai", "fake-gpt", "/v1/responses",
			`{"model":"fake-gpt","stream":true,"input":"` + strings.Repeat("a long prompt ", 200) + `"}`,
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
				"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The server had an error\",\"param\":null}\n\n"},
		{"anthropic overloaded", "anthropic", "claude-test", "/v1/messages",
			`{"model":"claude-test","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`,
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The upstream sends its error and then keeps the connection open until the gateway
			// lets it go: the caller's close is what ends the call.
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, tc.stream)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			t.Cleanup(up.Close)
			h := newHarness(t, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "up", Kind: tc.kind, BaseURL: up.URL, Models: []string{tc.model}}}
			})
			u, key := h.user("standard")
			resp := h.post(key, tc.path, tc.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			// Read up to the error, then leave, as an SDK that raises on it does.
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("stream ended before its error event: %v", err)
				}
				if strings.Contains(line, "The server had an error") || strings.Contains(line, "Overloaded") {
					break
				}
			}
			resp.Body.Close()
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
				t.Fatalf("the provider failed before any output or usage; settled %s %s, charged %d µUSD (in_tok=%d): want upstream_error at 0",
					run.State, run.SettleSource.String, run.ChargedMicro, run.InTok)
			}
		})
	}
}

// TestCallerStalledAfterTheUpstreamsErrorEventPaysNothing: the answer a relay cannot write
// after the provider's error event (the caller stopped reading; the write deadline cut it)
// ends the call as the caller's, but the provider had said it failed before any output or
// usage: settled at 0, upstream_error, as when the caller closes after that event.
func TestCallerStalledAfterTheUpstreamsErrorEventPaysNothing(t *testing.T) {
	// The provider's error, then keep-alive comments (no output) until the gateway lets go.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n")
		w.(http.Flusher).Flush()
		pad := ": " + strings.Repeat("x", 1<<20) + "\n\n"
		for r.Context().Err() == nil {
			if _, err := fmt.Fprint(w, pad); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "up", Kind: "openai", BaseURL: up.URL, Models: []string{"fake-gpt"}}}
		c.Limits.ClientWriteTimeout = 300 * time.Millisecond
	})
	u, key := h.user("standard")
	conn, err := net.Dial("tcp", h.gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a long prompt ", 200) + `"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		key, len(body), body)
	// The caller reads the answer's headers and then nothing more.
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("answer %v: %v", resp, err)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	var run holds.Run
	waitFor(t, "the call's settlement", func() bool {
		run, err = h.store.Run(context.Background(), u.ID, runID)
		return err == nil && run.State == holds.StateSettled
	})
	if run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
		t.Fatalf("the provider failed before any output or usage; settled %s, charged %d µUSD (in_tok=%d): want upstream_error at 0",
			run.SettleSource.String, run.ChargedMicro, run.InTok)
	}
}
