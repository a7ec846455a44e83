package metering

import (
	"fmt"
	"strings"
	"testing"
)

// TestAudioEstimateOfPlainPromptCostsNothing: EstimateAudioInputTokens runs in parseCall on every
// chat and Responses request, almost none of which carry audio. It copied the whole messages
// array (gjson.GetBytes: one allocation the size of the prompt) and walked every message and
// part for nothing: a second full parse of the prompt on the hot path of every plain call.
// A prompt without the word "audio" in any case, and without \u escapes (through which a key
// or value could spell it otherwise), has no audio part and must cost no allocation.
func TestAudioEstimateOfPlainPromptCostsNothing(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4o","messages":[`)
	for i := range 40 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"role":"user","content":[{"type":"text","text":"%s"}]}`, strings.Repeat("hello world ", 200))
	}
	b.WriteString(`]}`)
	body := []byte(b.String())
	for _, f := range []Format{FormatChat, FormatResponses} {
		if n := testing.AllocsPerRun(20, func() { EstimateAudioInputTokens(f, body) }); n != 0 {
			t.Errorf("format %v: %v allocations estimating the audio of a %d-byte prompt without any", f, n, len(body))
		}
	}
	// The pre-check must not hide a clip (see TestAudioInputEstimate for the spellings).
	for _, body := range []string{
		`{"messages":[{"role":"user","content":[{"TYPE":"input_audio"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","INPUT_AUDIO":{}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input_\u0061udio"}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"input\u005faudio"}]}]}`,
	} {
		if got := EstimateAudioInputTokens(FormatChat, []byte(body)); got != tokensPerMedia {
			t.Errorf("%s: %d, want %d", body, got, tokensPerMedia)
		}
	}
}
