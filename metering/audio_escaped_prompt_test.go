package metering

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAudioEstimateOfEscapedPlainPromptCostsNothing: any \u escape sent EstimateAudioInputTokens
// into its full second parse of the prompt, and most prompts carry one: Go's encoding/json
// writes <, > and & as \u003c, \u003e, \u0026, Python's json (ensure_ascii) every non-ASCII
// character as \uXXXX. Only an escape that spells a character of "_audio" can hide an audio
// part from the byte scan.
func TestAudioEstimateOfEscapedPlainPromptCostsNothing(t *testing.T) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for range 20 {
		ms = append(ms, msg{"user", "what does <div> & <span> do here? café " + strings.Repeat("some prompt text ", 40)})
	}
	body, err := json.Marshal(map[string]any{"model": "gpt-4o", "messages": ms})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `\u003c`) {
		t.Fatalf("body without escapes: %s", body)
	}
	body = []byte(strings.ReplaceAll(string(body), "café", `caf\u00e9`)) // as Python writes it
	for _, f := range []Format{FormatChat, FormatResponses} {
		if n := testing.AllocsPerRun(20, func() { EstimateAudioInputTokens(f, body) }); n != 0 {
			t.Errorf("format %v: %v allocations estimating the audio of a %d-byte escaped prompt without any", f, n, len(body))
		}
	}
	// Escapes that do spell part of it still find the clip.
	for _, body := range []string{
		`{"messages":[{"role":"user","content":[{"type":"input\u005Faudio"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","input_\u0041UDIO":{}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_audi\u006f"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_a\u0075dio"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_au\u0064io"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_aud\u0069o"}]}]}`,
	} {
		if got := EstimateAudioInputTokens(FormatChat, []byte(body)); got != tokensPerMedia {
			t.Errorf("%s: %d, want %d", body, got, tokensPerMedia)
		}
	}
}
