package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestOversizedAnswerWithoutAnOutputFigureChargedAsReadWhole: an answer too large to relay (502
// upstream_response_too_large) whose usage report at its end gives no figure of the output
// (completion_tokens absent, null or no number, and no total_tokens: a compatible server's) is
// charged as the same answer read whole is: its output the estimate of the text it carried,
// marked estimated (README, "What is billed when no usage arrives"). The text read past was
// measured, but added to the meter only when no report came at all: with a report, the output
// was billed at 0 — a prompt-only charge for an answer of 30 000 words.
func TestOversizedAnswerWithoutAnOutputFigureChargedAsReadWhole(t *testing.T) {
	words := strings.Repeat("words ", 30_000)
	up := &fixedUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	gateway := func(limit int64) *harness {
		return newHarness(t, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}},
				{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
			c.Plans["standard"] = bigPlan(c.Plans["standard"])
			c.Limits.MaxResponseBytes = limit
		})
	}
	small, whole := gateway(128<<10), gateway(32<<20)
	for _, tc := range []struct{ name, path, request, body string }{
		{"chat, completion_tokens absent", "/v1/chat/completions", chatBody,
			`{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"` +
				words + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20}}`},
		{"chat, completion_tokens null", "/v1/chat/completions", chatBody,
			`{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"` +
				words + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":null,"total_tokens":null}}`},
		{"completions, completion_tokens absent", "/v1/completions", `{"model":"fake-gpt","prompt":"Say hello."}`,
			`{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[{"index":0,"text":"` + words +
				`","finish_reason":"stop"}],"usage":{"prompt_tokens":20}}`},
		{"anthropic message, output_tokens absent", "/v1/messages",
			`{"model":"claude-test","max_tokens":64000,"messages":[{"role":"user","content":"Say hello."}]}`,
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"` + words +
				`"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":20}}`},
		{"responses, output_tokens null", "/v1/responses", `{"model":"fake-gpt","input":"Say hello."}`,
			`{"id":"resp_1","object":"response","status":"completed","model":"fake-gpt","output":[{"type":"message","id":"msg_1","role":"assistant",` +
				`"content":[{"type":"output_text","text":"` + words + `","annotations":[]}]}],"usage":{"input_tokens":20,"output_tokens":null}}`},
	} {
		wu, wkey := whole.user("standard")
		up.set(tc.body, false)
		resp := whole.post(wkey, tc.path, tc.request, nil)
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s read whole: %d", tc.name, resp.StatusCode)
		}
		want := whole.run(wu.ID, resp.Header.Get(proxy.RunIDHeader))
		if !want.Estimated || want.OutTok < 40_000 {
			t.Fatalf("%s read whole: run %+v, want its output estimated from its 180 000 bytes of text", tc.name, want)
		}
		for _, length := range []bool{false, true} {
			su, skey := small.user("standard")
			up.set(tc.body, length)
			resp := small.post(skey, tc.path, tc.request, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_response_too_large" {
				t.Fatalf("%s (Content-Length %v): %d %s, want 502 upstream_response_too_large", tc.name, length, resp.StatusCode, body)
			}
			got := small.run(su.ID, resp.Header.Get(proxy.RunIDHeader))
			if got.OutTok != want.OutTok || got.CostMicro != want.CostMicro || !got.Estimated {
				t.Errorf("%s (Content-Length %v): too large to relay, charged %d µUSD for %d output tokens (estimated %v); read whole, %d µUSD for %d",
					tc.name, length, got.CostMicro, got.OutTok, got.Estimated, want.CostMicro, want.OutTok)
			}
		}
	}
}
