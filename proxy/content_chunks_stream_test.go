package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// magistralChunk is a chat chunk as Mistral's reasoning models (Magistral; mistral-medium and
// -small with reasoning_effort) stream it: delta.content is not a string but a list of chunks,
// a "thinking" one holding text chunks of its own, then "text" ones
// (https://docs.mistral.ai/capabilities/reasoning/).
func magistralChunk(kind, text string) string {
	part := `{"type":"text","text":"` + text + `"}`
	if kind == "thinking" {
		part = `{"type":"thinking","thinking":[` + part + `]}`
	}
	return `data: {"id":"m1","object":"chat.completion.chunk","created":1762355135,"model":"fake-gpt","choices":[{"index":0,"delta":{"content":[` +
		part + `]},"finish_reason":null}]}` + "\n\n"
}

// TestChunkedContentStreamCutIsChargedItsOutput: a stream whose text comes as lists of content
// chunks (Mistral's reasoning models: thinking chunks, then text chunks) and that ends without
// its usage — the upstream cut inside an event, or the provider's error event after the
// thinking — is charged the estimate of the output streamed, as any stream cut there is. The
// meter counted delta.content only when it is a string, so the caller had 1 800 bytes of the
// model's words and paid for none of them: the cut stream its prompt's estimate alone, the
// failure after output nothing at all (upstream_error, "before producing anything").
func TestChunkedContentStreamCutIsChargedItsOutput(t *testing.T) {
	think := strings.Repeat("Let me think about the billing question carefully. ", 6) // 300 bytes
	answer := strings.Repeat("The invoice total is correct. ", 10)                    // 300 bytes
	var whole strings.Builder
	whole.WriteString(`data: {"id":"m1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	for range 4 {
		whole.WriteString(magistralChunk("thinking", think))
	}
	for range 2 {
		whole.WriteString(magistralChunk("text", answer))
	}
	const streamed = 6 * 300 // bytes of the model's words the caller got
	wantOut := int64(streamed / 4)
	for _, tc := range []struct {
		name, end, source string
	}{
		{"upstream cut inside an event", magistralChunk("text", answer)[:60], holds.SourceStreamError},
		{"provider error event after output", `data: {"object":"error","error":{"message":"Internal server error","type":"internal_error","code":"1000"}}` + "\n\n", holds.SourceStreamError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, closeDelimited(t, "text/event-stream", whole.String()+tc.end), nil)
			u, key := h.user("standard")
			status, got, run := h.postRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
			t.Logf("status %d, %d bytes to the caller; run in=%d out=%d est=%v src=%s charged=%d µUSD",
				status, len(got), run.InTok, run.OutTok, run.Estimated, run.SettleSource.String, run.ChargedMicro)
			if status != 200 || !strings.HasPrefix(string(got), whole.String()) {
				t.Fatalf("the caller did not get the stream's whole events: status %d, %q", status, got)
			}
			if run.SettleSource.String != tc.source || !run.Estimated || run.OutTok < wantOut {
				t.Fatalf("the caller got %d bytes of the model's words (%d tokens' estimate); run settled %s out=%d estimated=%v charged=%d µUSD: "+
					"want %s charged the estimate of the output streamed", streamed, wantOut, run.SettleSource.String, run.OutTok,
					run.Estimated, run.ChargedMicro, tc.source)
			}
		})
	}
}

// TestChunkedContentAnswerCutIsChargedItsOutput: the same answer non-streamed — its message's
// content a list of chunks — whose body breaks partway is charged the text read, as a broken
// answer whose content is a string is (TestBrokenNonStreamedAnswerIsChargedTheOutputRead): of
// a size to relay, or too large to and read past. It was charged its prompt's estimate alone.
func TestChunkedContentAnswerCutIsChargedItsOutput(t *testing.T) {
	up := &cutUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	const head = `{"id":"m1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":[` +
		`{"type":"thinking","thinking":[{"type":"text","text":"`
	words := strings.Repeat("words ", 50_000)
	for _, tc := range []struct {
		name  string
		limit int64
		text  int // bytes of thinking text sent before the break
	}{
		{"relayable", 32 << 20, 40_000},
		{"too large", 32 << 10, 100_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "cut", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
				c.Limits.MaxResponseBytes = tc.limit
			})
			body := head + words[:tc.text+1000] + `"}]},{"type":"text","text":"done"}]},"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`
			up.set(body, len(head)+tc.text, "close")
			u, key := h.user("standard")
			status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
			wantOut := metering.EstimateOutputTokens(int64(tc.text))
			t.Logf("status %d %.80s; run in=%d out=%d est=%v src=%s charged=%d µUSD", status, answer, run.InTok, run.OutTok,
				run.Estimated, run.SettleSource.String, run.ChargedMicro)
			if status != http.StatusBadGateway || run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.OutTok != wantOut {
				t.Fatalf("status %d, run source=%s estimated=%v out=%d: want 502, stream_error charged %d output tokens (the text read)",
					status, run.SettleSource.String, run.Estimated, run.OutTok, wantOut)
			}
		})
	}
}
