package proxy

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// TestMeterOversizedChargesEveryTaskOfALlamaBody: llama.cpp's server answers a call of several
// answers (n > 1, or a completions batch) whole by putting every task's choice into the first
// task's body, whose usage and timings stay that first task's alone; read whole, the other
// choices' text is charged at its estimate on top of the report. The same answer too large to
// relay, read past for its report, was charged the first task's report alone: its other
// answers, most of its bytes, went unbilled. It is charged as read whole. An answer whose
// report counts every choice (no task timings) is charged its report either way.
func TestMeterOversizedChargesEveryTaskOfALlamaBody(t *testing.T) {
	second, third := strings.Repeat("b", 300<<10), strings.Repeat("c", 200<<10)
	bodies := map[metering.Format]func(timings string) string{
		metering.FormatChat: func(timings string) string {
			return `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"aaaa"}},` +
				`{"finish_reason":"length","index":1,"message":{"role":"assistant","content":"` + second + `"}},` +
				`{"finish_reason":"length","index":2,"message":{"role":"assistant","content":"` + third + `"}}],` +
				`"created":1,"model":"m","system_fingerprint":"b1","object":"chat.completion",` +
				`"usage":{"completion_tokens":2,"prompt_tokens":40,"total_tokens":42},"id":"chatcmpl-l"` + timings + `}`
		},
		metering.FormatCompletions: func(timings string) string {
			return `{"choices":[{"text":"aaaa","index":0,"logprobs":null,"finish_reason":"stop"},` +
				`{"text":"` + second + `","index":1,"logprobs":null,"finish_reason":"length"},` +
				`{"text":"` + third + `","index":2,"logprobs":null,"finish_reason":"length"}],` +
				`"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion",` +
				`"usage":{"completion_tokens":2,"prompt_tokens":40,"total_tokens":42},"id":"cmpl-l"` + timings + `}`
		},
	}
	for format, body := range bodies {
		for _, timings := range []string{`,"timings":{"cache_n":0,"prompt_n":40,"prompt_ms":1.5,"predicted_n":2,"predicted_ms":3.1}`, ``} {
			answer := body(timings)
			whole := metering.NewMeter(format)
			whole.Body([]byte(answer))
			want := whole.Result()
			const headLen = 64 << 10
			past := metering.NewMeter(format)
			meterOversized(past, []byte(answer[:headLen]), strings.NewReader(answer[headLen:]), 4<<20)
			got := past.Result()
			if got.Usage != want.Usage || got.Estimated != want.Estimated || got.Reported != want.Reported || got.Model != want.Model {
				t.Errorf("format %v, timings %q: read past, %+v (estimated %v); read whole, %+v (estimated %v)",
					format, timings, got.Usage, got.Estimated, want.Usage, want.Estimated)
			}
		}
	}
}
