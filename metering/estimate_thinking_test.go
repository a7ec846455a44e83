package metering

import (
	"strings"
	"testing"
)

// TestInputEstimateCountsTheCurrentToolLoopsThinking: in a tool loop with extended thinking the
// assistant turn's thinking (or redacted_thinking) blocks must be sent back with its tool
// results, and Anthropic bills them as input; a call cut before its usage was estimated without
// them, often most of such a prompt. Thinking of turns before the last user turn that is not
// only tool results is stripped by Anthropic and not billed: not counted either.
func TestInputEstimateCountsTheCurrentToolLoopsThinking(t *testing.T) {
	thought := strings.Repeat("x", 40_000) // ~10 000 tokens
	loop := func(block string) string {
		return `{"model":"m","messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[` + block + `,{"type":"tool_use","id":"t","name":"f","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}`
	}
	for _, tc := range []struct {
		name, body string
	}{
		{"thinking", loop(`{"type":"thinking","thinking":"` + thought + `","signature":"s"}`)},
		{"redacted_thinking", loop(`{"type":"redacted_thinking","data":"` + thought + `"}`)},
	} {
		if got := EstimateInputTokens(FormatAnthropic, []byte(tc.body)); got < 10_000 {
			t.Errorf("%s: estimate %d tokens for a tool loop sending back 40 000 bytes of it, want ≥ 10 000", tc.name, got)
		}
	}
	earlier := `{"model":"m","messages":[{"role":"user","content":"go"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"` + thought + `","signature":"s"},{"type":"text","text":"done"}]},` +
		`{"role":"user","content":"next"}]}`
	if got := EstimateInputTokens(FormatAnthropic, []byte(earlier)); got > 100 {
		t.Errorf("estimate %d tokens for a prompt whose only thinking is an earlier turn's (stripped by Anthropic), want a few", got)
	}
}
