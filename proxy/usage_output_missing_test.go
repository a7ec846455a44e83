package proxy_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestUsageWithoutOutputTokensBillsTheOutput: an OpenAI-style report with prompt_tokens and
// no figure of the output (completion_tokens absent, or a string holding no number, and no total_tokens) billed
// the answer's output at 0, whatever text it carried: a compatible server that leaves the
// count out, or writes something else in its place, was charged the prompt alone. The output is the
// estimate of the text relayed, marked estimated, as Anthropic's missing final count is.
func TestUsageWithoutOutputTokensBillsTheOutput(t *testing.T) {
	text := strings.Repeat("word ", 160)
	dir := t.TempDir()
	writeFixture(t, dir, "no_output.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"`+text+`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12}}`)
	writeFixture(t, dir, "output_string.sse", "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\""+text+"\"}}]}\n\n"+
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":\"n/a\"}}\n\n"+
		"data: [DONE]\n\n")
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	price := pricing.Price{Input: h.cfg.Models["fake-gpt"].Input.Micro, Output: h.cfg.Models["fake-gpt"].Output.Micro}
	want := pricing.Usage{Input: 12, Output: metering.EstimateOutputTokens(int64(len(text)))}
	for _, tc := range []struct{ name, body, fixture string }{
		{"body without completion_tokens", `{"model":"fake-gpt","max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`, "no_output.json"},
		{"stream with completion_tokens no number", `{"model":"fake-gpt","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`, "output_string.sse"},
	} {
		run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", tc.body, map[string]string{fakellm.HeaderReplay: tc.fixture})
		if run.Usage() != want || !run.Estimated || run.CostMicro != price.Cost(want) {
			t.Errorf("%s: settled %+v (estimated %v) at %d µUSD, want %+v at %d, estimated",
				tc.name, run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
		}
	}
}

// TestAnthropicAnswerWithoutOutputTokensBillsTheOutput: a whole Anthropic message whose usage
// gives no output_tokens (an Anthropic-compatible server that leaves it out or writes null) was
// settled with its output at 0, the same answer streamed at the estimate of its text: the
// whole answer's usage was taken as final. Both are charged that estimate, marked estimated.
func TestAnthropicAnswerWithoutOutputTokensBillsTheOutput(t *testing.T) {
	text := strings.Repeat("word ", 160)
	dir := t.TempDir()
	writeFixture(t, dir, "anth_no_output.json", `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",
"content":[{"type":"text","text":"`+text+`"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":null}}`)
	writeFixture(t, dir, "anth_no_output.sse",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"usage\":{\"input_tokens\":12}}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""+text+"\"}}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":12}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	price := pricing.Price{Input: h.cfg.Models["claude-test"].Input.Micro, Output: h.cfg.Models["claude-test"].Output.Micro}
	want := pricing.Usage{Input: 12, Output: metering.EstimateOutputTokens(int64(len(text)))}
	for _, tc := range []struct{ name, body, fixture string }{
		{"whole", `{"model":"claude-test","max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`, "anth_no_output.json"},
		{"stream", `{"model":"claude-test","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"talk"}]}`, "anth_no_output.sse"},
	} {
		run, _ := h.answeredRun(u.ID, key, "/v1/messages", tc.body, map[string]string{fakellm.HeaderReplay: tc.fixture})
		if run.Usage() != want || !run.Estimated || run.CostMicro != price.Cost(want) {
			t.Errorf("%s: settled %+v (estimated %v) at %d µUSD, want %+v at %d, estimated",
				tc.name, run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
		}
	}
}
