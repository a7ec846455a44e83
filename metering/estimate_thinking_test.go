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
		// Types read with case folded, as a provider decoding with Go's encoding/json reads
		// them (and as a part's are): a thinking block "Type"d was not counted, and a tool
		// result so made the loop's user turn look like a new turn, its thinking stripped.
		{"thinking typed in another case", loop(`{"Type":"thinking","thinking":"` + thought + `","signature":"s"}`)},
		{"tool result typed in another case", strings.Replace(loop(`{"type":"thinking","thinking":"`+thought+`","signature":"s"}`),
			`{"type":"tool_result"`, `{"TYPE":"tool_result"`, 1)},
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

// TestInputEstimateCountsTheSignedThinking: a thinking block sent back in the current tool loop
// carries the model's whole thinking encrypted in its signature (on Claude 4 models its
// thinking text is only a summary of it), which the model reads back and Anthropic bills as
// input. Only the summary was counted, and a loop whose thinking was long was estimated at a
// fraction of it. The signature's bytes stand for its tokens, as a redacted_thinking block's
// data's do; the larger of the two counts, never both (a Claude 3.7 block's text is the whole
// thinking, its signature short).
func TestInputEstimateCountsTheSignedThinking(t *testing.T) {
	whole := strings.Repeat("x", 40_000) // ~10 000 tokens
	loop := func(block string) string {
		return `{"model":"m","messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[` + block + `,{"type":"tool_use","id":"t","name":"f","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}]}`
	}
	if got := EstimateInputTokens(FormatAnthropic, []byte(loop(`{"type":"thinking","thinking":"a short summary","signature":"`+whole+`"}`))); got < 10_000 {
		t.Errorf("estimate %d tokens for a tool loop sending back a summary signed with 40 000 bytes, want ≥ 10 000", got)
	}
	if got := EstimateInputTokens(FormatAnthropic, []byte(loop(`{"type":"thinking","thinking":"`+whole+`","signature":"`+whole+`"}`))); got >= 15_000 {
		t.Errorf("estimate %d tokens for 40 000 bytes of thinking and as long a signature, want them counted once (< 15 000)", got)
	}
	earlier := `{"model":"m","messages":[{"role":"user","content":"go"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"s","signature":"` + whole + `"},{"type":"text","text":"done"}]},` +
		`{"role":"user","content":"next"}]}`
	if got := EstimateInputTokens(FormatAnthropic, []byte(earlier)); got > 100 {
		t.Errorf("estimate %d tokens for a prompt whose only signed thinking is an earlier turn's (stripped by Anthropic), want a few", got)
	}
}

// TestInputEstimateCountsTheCurrentToolLoopsReasoning: a Responses request that sends back the
// reasoning items of its current tool loop (after its last user message) — their summary, and
// with store off their encrypted_content, the model's whole reasoning, which the provider
// decrypts for the model to read — is billed that reasoning as input. Neither was counted, and
// a stateless tool loop with long reasoning was estimated at a few tokens. The encrypted
// content is opaque: its bytes stand for its tokens, as an Anthropic redacted_thinking's data's
// do; the larger of it and the text sent beside it counts, never both. Reasoning items before
// the last user message are dropped by the provider, unbilled: not counted either.
func TestInputEstimateCountsTheCurrentToolLoopsReasoning(t *testing.T) {
	whole := strings.Repeat("x", 40_000) // ~10 000 tokens
	loop := func(item string) string {
		return `{"model":"m","input":[{"role":"user","content":"go"},` + item + `,` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c","output":"ok"}]}`
	}
	for _, tc := range []struct {
		name, item string
	}{
		{"encrypted content", `{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"short"}],"encrypted_content":"` + whole + `"}`},
		{"summary", `{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"` + whole + `"}]}`},
		{"reasoning text", `{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"` + whole + `"}]}`},
		// A provider decoding with Go's encoding/json reads "Type" as the item's type, as the
		// estimate reads a part's (partLen): read as no type, the item's summary went uncounted.
		{"summary of an item typed in another case", `{"Type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"` + whole + `"}]}`},
	} {
		if got := EstimateInputTokens(FormatResponses, []byte(loop(tc.item))); got < 10_000 {
			t.Errorf("%s: estimate %d tokens for a tool loop sending back 40 000 bytes of reasoning, want ≥ 10 000", tc.name, got)
		}
	}
	both := `{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"` + whole + `"}],"encrypted_content":"` + whole + `"}`
	if got := EstimateInputTokens(FormatResponses, []byte(loop(both))); got >= 15_000 {
		t.Errorf("estimate %d tokens for 40 000 bytes of summary and as long an encrypted content, want them counted once (< 15 000)", got)
	}
	earlier := `{"model":"m","input":[{"role":"user","content":"go"},` + both + `,` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]},{"role":"user","content":"next"}]}`
	if got := EstimateInputTokens(FormatResponses, []byte(earlier)); got > 100 {
		t.Errorf("estimate %d tokens for an input whose only reasoning is an earlier turn's (dropped by the provider), want a few", got)
	}
}

// TestInputEstimateCountsTheReasoningOfChatToolTurns: a chat provider that shows its reasoning
// (DeepSeek's reasoning_content, a router's reasoning) keeps the reasoning of every turn that
// called tools in the model's context: the caller must send it back with those turns, in every
// later request, and it is billed as input. It was not read, and a long agent loop was
// estimated without it. The reasoning of a turn without tool calls the provider ignores,
// unbilled: not counted either. A message giving it under both names counts it once.
func TestInputEstimateCountsTheReasoningOfChatToolTurns(t *testing.T) {
	thought := strings.Repeat("x", 40_000) // ~10 000 tokens
	toolTurn := func(reasoning string) string {
		return `{"model":"m","messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":null,` + reasoning + `,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c","content":"ok"},{"role":"assistant","content":"done"},{"role":"user","content":"next"}]}`
	}
	for _, tc := range []struct {
		name, reasoning string
	}{
		{"reasoning_content", `"reasoning_content":"` + thought + `"`},
		{"reasoning", `"reasoning":"` + thought + `"`},
	} {
		if got := EstimateInputTokens(FormatChat, []byte(toolTurn(tc.reasoning))); got < 10_000 {
			t.Errorf("%s: estimate %d tokens for a tool turn's 40 000 bytes of reasoning sent back, want ≥ 10 000", tc.name, got)
		}
	}
	if got := EstimateInputTokens(FormatChat, []byte(toolTurn(`"reasoning_content":"`+thought+`","reasoning":"`+thought+`"`))); got >= 15_000 {
		t.Errorf("estimate %d tokens for 40 000 bytes of reasoning under both names, want it counted once (< 15 000)", got)
	}
	plain := `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":"done","reasoning_content":"` + thought + `"},` +
		`{"role":"user","content":"next"}]}`
	if got := EstimateInputTokens(FormatChat, []byte(plain)); got > 100 {
		t.Errorf("estimate %d tokens for a prompt whose only reasoning is a turn's without tool calls (ignored by the provider), want a few", got)
	}
}
