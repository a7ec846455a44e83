package metering_test

import (
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestEstimateSamePromptSameTokensInEveryFormat: one prompt, a system text and a user text,
// is estimated the same whichever format carries it. A system prompt (Anthropic's system,
// Responses' instructions) and a Responses input given as one string, or as a bare string in
// its input list, are messages with the same overhead as a chat message: without it they were
// estimated short, and a call charged its estimate (a stream cut before its usage), or whose
// output bound was fitted to its cap by the estimate, cost less than the same words in chat.
func TestEstimateSamePromptSameTokensInEveryFormat(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format metering.Format
		body   string
	}{
		{"chat", metering.FormatChat, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"cap test"}]}`},
		{"anthropic", metering.FormatAnthropic, `{"system":"be brief","messages":[{"role":"user","content":"cap test"}]}`},
		{"anthropic system blocks", metering.FormatAnthropic, `{"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"cap test"}]}`},
		{"responses string", metering.FormatResponses, `{"instructions":"be brief","input":"cap test"}`},
		{"responses message", metering.FormatResponses, `{"instructions":"be brief","input":[{"role":"user","content":"cap test"}]}`},
		{"responses bare string item", metering.FormatResponses, `{"instructions":"be brief","input":["cap test"]}`},
	} {
		// Two messages of 8 bytes: 2 tokens of text and 4 of overhead each.
		if got, _ := metering.EstimatePrompt(tc.format, []byte(tc.body)); got != 12 {
			t.Errorf("%s: estimated %d tokens, want 12", tc.name, got)
		}
	}
	// An empty system prompt is no message.
	if got, _ := metering.EstimatePrompt(metering.FormatAnthropic, []byte(`{"system":"","messages":[{"role":"user","content":"cap test"}]}`)); got != 6 {
		t.Errorf("empty system prompt: estimated %d tokens, want 6", got)
	}
}
