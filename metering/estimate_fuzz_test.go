package metering

import (
	"testing"
)

// estimateSeeds are request bodies of every format, the parts the estimates read among them.
var estimateSeeds = []struct {
	f    Format
	body string
}{
	{FormatChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}`},
	{FormatChat, `{"messages":[{"role":"assistant","audio":{"id":"audio_1"},"tool_calls":[{"function":{"arguments":"{\"a\":1}"}}]},{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQAAAAA=","format":"wav"}}]}]}`},
	{FormatChat, `{"messages":[{"role":"user","content":[{"Type":"input_audio","INPUT_AUDIO":{"data":"SUQzBAAAAAAAAA=="}}]},{"role":"user","\u0061udio":{"id":"x"}}]}`},
	{FormatAnthropic, `{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]},{"type":"document","source":{"type":"text","data":"doc"}},{"type":"tool_use","input":{"q":1}}]}]}`},
	{FormatResponses, `{"instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"t"},{"type":"input_audio","input_audio":{"data":"//uQZAAAAAAA"}}]},{"type":"function_call","arguments":"{}"},{"type":"function_call_output","output":"o"}],"text":{"format":{"type":"json_schema"}}}`},
	{FormatResponses, `{"input":"just text"}`},
	{FormatCompletions, `{"prompt":[[1,2,3],[4,[5,[6,[7,[8]]]]]]}`},
	{FormatEmbeddings, `{"input":["a","b"]}`},
}

// FuzzEstimatePrompt estimates any body in any format: no estimate is negative or past
// maxEstimatedTokens, the one-call EstimatePrompt agrees with the estimates taken apart, and
// the fast look for audio (mayHoldAudio) is sound: a body it says holds none estimates the same
// as when the full look is made.
func FuzzEstimatePrompt(f *testing.F) {
	for _, s := range estimateSeeds {
		f.Add([]byte(s.body), formatByte(s.f))
	}
	f.Fuzz(func(t *testing.T, body []byte, format uint8) {
		fm := fuzzFormat(format)
		input, audio := EstimatePrompt(fm, body)
		if input < 0 || input > maxEstimatedTokens || audio < 0 || audio > maxEstimatedTokens {
			t.Fatalf("EstimatePrompt = %d, %d audio", input, audio)
		}
		if in, au := EstimateInputTokens(fm, body), EstimateAudioInputTokens(fm, body); in != input || au != audio {
			t.Fatalf("EstimatePrompt = %d, %d audio; apart %d, %d audio", input, audio, in, au)
		}
		if !mayHoldAudio(body) {
			if full := estimateAudio(fm, body, true); full != 0 {
				t.Fatalf("mayHoldAudio is false, the full look finds %d audio tokens", full)
			}
			if full := estimateInput(fm, body, true); full != input {
				t.Fatalf("mayHoldAudio is false: input %d, the full look %d", input, full)
			}
		}
		if n := EstimateNotHandedOn(body); n < 0 || n > maxEstimatedTokens {
			t.Fatalf("EstimateNotHandedOn = %d", n)
		}
		if n := UserTurns(fm, body); n < 0 {
			t.Fatalf("UserTurns = %d", n)
		}
		ids := SpokenAnswersSentBack(body)
		if len(ids) > maxSentBack {
			t.Fatalf("%d spoken answers sent back, at most %d", len(ids), maxSentBack)
		}
		for _, id := range ids {
			if id == "" || len(id) > maxModelName {
				t.Fatalf("sent-back id of %d bytes", len(id))
			}
		}
		if len(ids) > 0 && audio == 0 && fm == FormatChat {
			t.Fatalf("spoken answers %q sent back, no audio estimated", ids)
		}
	})
}

// FuzzEstimateOutputTokens: the output estimate is never negative, at most
// maxEstimatedTokens, 0 for no text and monotone in the text's bytes.
func FuzzEstimateOutputTokens(f *testing.F) {
	f.Add(int64(0), int64(1))
	f.Add(int64(3), int64(4))
	f.Add(int64(1<<62), int64(-1))
	f.Fuzz(func(t *testing.T, a, b int64) {
		// OutputChars counts bytes received: never negative, and far below 2^62.
		a, b = min(max(a, 0), 1<<62), min(max(b, 0), 1<<62)
		if a > b {
			a, b = b, a
		}
		ea, eb := EstimateOutputTokens(a), EstimateOutputTokens(b)
		if ea < 0 || eb > maxEstimatedTokens || ea > eb || (a == 0) != (ea == 0) {
			t.Fatalf("EstimateOutputTokens(%d) = %d, (%d) = %d", a, ea, b, eb)
		}
	})
}
