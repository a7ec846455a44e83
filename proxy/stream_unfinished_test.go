package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestStreamEndingCleanlyBeforeItsFinalEventIsABreak: Anthropic's Messages stream always ends
// with message_stop, the Responses API's with response.completed (or incomplete, or failed); a
// stream of either that ends cleanly between two events before it was cut (a body delimited by
// the connection's close reads a dropped connection so; so does a proxy on the way that ends
// its chunked answer when its upstream went away). Read as a complete answer, the caller saw a
// clean end of a cut answer, the call settled as complete, and an Idempotency-Key's retries
// replayed that clean end. It is a break: the events, then an upstream_broken error event;
// stream_error; the key's retries replay the answer with its error event.
func TestStreamEndingCleanlyBeforeItsFinalEventIsABreak(t *testing.T) {
	anthropicStart := `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"MODEL","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":300,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`
	anthropicEvents := "event: message_start\ndata: " + anthropicStart + "\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello billing team, here is the first part of a longer answer.\"}}\n\n"
	cases := []struct {
		name, kind, model, path, body, events, errEvent string
	}{
		// The stream ended inside its last event, whole but for its blank line: passed on, and
		// ended by the gateway's blank line before the error event, which the caller's parser
		// read as more lines of that event.
		{"anthropic ended inside an event", "anthropic", "claude-test", "/v1/messages",
			`{"model":"MODEL","stream":true,"max_tokens":512,"messages":[{"role":"user","content":"hello"}]}`,
			strings.TrimSuffix(anthropicEvents, "\n"),
			"\n\nevent: error\ndata: {\"error\":{\"code\":\"upstream_broken\""},
		{"anthropic", "anthropic", "claude-test", "/v1/messages",
			`{"model":"MODEL","stream":true,"max_tokens":512,"messages":[{"role":"user","content":"hello"}]}`,
			anthropicEvents,
			"event: error\ndata: {\"error\":{\"code\":\"upstream_broken\""},
		{"responses", "openai", "fake-gpt", "/v1/responses",
			`{"model":"MODEL","stream":true,"input":"hello"}`,
			"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"MODEL\",\"output\":[],\"usage\":null}}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hello billing team, here is the first part of a longer answer.\"}\n\n",
			"event: error\ndata: {\"code\":\"upstream_broken\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			events := strings.ReplaceAll(tc.events, "MODEL", tc.model)
			var sent atomic.Int32
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sent.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, events) // and the handler returns: a clean end of a chunked body
			}))
			t.Cleanup(up.Close)
			h := newHarness(t, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "up", Kind: tc.kind, BaseURL: up.URL, Models: []string{tc.model}}}
			})
			u, key := h.user("standard")
			hdr := map[string]string{"Idempotency-Key": "unfinished-" + tc.name}
			body := strings.ReplaceAll(tc.body, "MODEL", tc.model)
			resp := h.post(key, tc.path, body, hdr)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			rest, ok := strings.CutPrefix(string(got), events)
			if !ok || !strings.HasPrefix(rest, tc.errEvent) || !strings.HasSuffix(rest, "}\n\n") ||
				strings.Count(strings.TrimPrefix(rest, "\n\n"), "\n\n") != 1 {
				t.Fatalf("caller got %q\nwant the events, then one upstream_broken error event", got)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if run.SettleSource.String != holds.SourceStreamError || run.OutTok == 0 {
				t.Errorf("run settled by %q out=%d; want stream_error, charged the output streamed", run.SettleSource.String, run.OutTok)
			}
			// An attempt that produced output pins its key (its retry would be charged again):
			// the retry replays the answer as its caller had it, the break said.
			retry := h.post(key, tc.path, body, hdr)
			again, _ := io.ReadAll(retry.Body)
			retry.Body.Close()
			if retry.Header.Get(proxy.ReplayedHeader) != "true" || string(again) != string(got) || sent.Load() != 1 {
				t.Errorf("the key's retry: replayed=%q, upstream asked %d times, answer %q; want the cut answer replayed with its error event",
					retry.Header.Get(proxy.ReplayedHeader), sent.Load(), again)
			}
		})
	}
}
