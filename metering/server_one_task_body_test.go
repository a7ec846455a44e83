package metering

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskBodyOfOneChoiceIsChargedItsReport: a llama.cpp server's whole answer of one
// choice carries that one task's usage and timings: its report counts all the answer, and it is
// charged the report alone, not estimated. Only an answer of several choices (wholeTasks: the
// first task's report beside the others' choices) has text its report leaves out; taken for
// one, a plain llama.cpp answer was charged its text's estimate on top of its report.
func TestServerTaskBodyOfOneChoiceIsChargedItsReport(t *testing.T) {
	text := strings.Repeat("a", 400)
	timings := `,"timings":{"prompt_n":40,"predicted_n":100}`
	for _, tc := range []struct {
		f    Format
		body string
	}{
		{FormatChat, `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"` + text + `"}}],` +
			`"created":1,"model":"m","object":"chat.completion","usage":{"completion_tokens":100,"prompt_tokens":40,"total_tokens":140},"id":"chatcmpl-l"` + timings + `}`},
		{FormatCompletions, `{"choices":[{"text":"` + text + `","index":0,"logprobs":null,"finish_reason":"stop"}],` +
			`"created":1,"model":"m","object":"text_completion","usage":{"completion_tokens":100,"prompt_tokens":40,"total_tokens":140},"id":"cmpl-l"` + timings + `}`},
	} {
		m := NewMeter(tc.f)
		m.Body([]byte(tc.body))
		if got, want := m.Result(), (pricing.Usage{Input: 40, Output: 100}); got.Usage != want || got.Estimated || !got.Reported {
			t.Errorf("format %v, llama.cpp's body of one task: got %+v (reported %v, estimated %v), want %+v, its report alone",
				tc.f, got.Usage, got.Reported, got.Estimated, want)
		}
	}
}
