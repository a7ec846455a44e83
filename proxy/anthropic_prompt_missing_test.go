package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
)

// TestAnthropicUsageWithoutInputTokensBillsThePromptEstimate: an Anthropic-shaped usage that
// never gives input_tokens (an Anthropic-compatible server whose message_start carries no usage
// and whose message_delta counts the output alone; a whole message whose usage is output_tokens
// alone) says nothing of the prompt. As for an OpenAI-style report without prompt_tokens, the
// prompt is its estimate, marked estimated: read as 0, the prompt went unbilled.
func TestAnthropicUsageWithoutInputTokensBillsThePromptEstimate(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "anth_no_input.sse",
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[]}}\n\n"+
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello.\"}}\n\n"+
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":30}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	writeFixture(t, dir, "anth_no_input.json", `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",
"content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","usage":{"output_tokens":30}}`)
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	price := pricing.Price{Input: h.cfg.Models["claude-test"].Input.Micro, Output: h.cfg.Models["claude-test"].Output.Micro}
	prompt := `"max_tokens":50,"system":"` + longText(2000) + `","messages":[{"role":"user","content":"say hello, and nothing else, please"}]}`

	for _, tc := range []struct{ name, body, fixture string }{
		{"stream", `{"model":"claude-test","stream":true,` + prompt, "anth_no_input.sse"},
		{"whole", `{"model":"claude-test",` + prompt, "anth_no_input.json"},
	} {
		run, _ := h.answeredRun(u.ID, key, "/v1/messages", tc.body, map[string]string{fakellm.HeaderReplay: tc.fixture})
		got := run.Usage()
		if got.Input < 500 || got.Output != 30 || !run.Estimated || run.CostMicro != price.Cost(got) {
			t.Errorf("%s: settled %+v (estimated %v) at %d µUSD, want the prompt's estimate (> 500 tokens of a 2 000-byte system prompt) and 30 output, estimated",
				tc.name, got, run.Estimated, run.CostMicro)
		}
	}
}

// longText is n bytes of plain prompt text.
func longText(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcd "[i%5]
	}
	return string(b)
}
