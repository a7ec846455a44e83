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

// TestMeterOversizedChargesEveryAnswerOfALlamaArray: a llama.cpp server built before it merged a
// batch's answers answers a /v1/completions batch of several prompts, not streamed, with a JSON
// array of whole answers, each one prompt's task with its own usage; read whole, every
// element's report is charged, summed (metering's taskAnswers). The same answer too large to
// relay, read past for the report at its end, was charged the last element's report alone: the
// other prompts and their answers, most of its bytes, went unbilled. It is charged as read
// whole: every report, or, where one element has none, the estimate of every element's text.
// Cut before its end, it is charged the estimate of the text read, not nothing.
func TestMeterOversizedChargesEveryAnswerOfALlamaArray(t *testing.T) {
	element := func(index int, text string, usage string) string {
		return `{"choices":[{"text":"` + text + `","index":` + string(rune('0'+index)) + `,"logprobs":null,"finish_reason":"length"}],` +
			`"created":1,"model":"m","system_fingerprint":"b4800-1a2b3c4","object":"text_completion"` + usage + `,"id":"cmpl-l"}`
	}
	usage := func(prompt, completion string) string {
		return `,"usage":{"completion_tokens":` + completion + `,"prompt_tokens":` + prompt + `,"total_tokens":1},` +
			`"timings":{"prompt_n":` + prompt + `,"prompt_ms":1.5,"predicted_n":` + completion + `,"predicted_ms":3.1}`
	}
	first, second, third := strings.Repeat("a", 300<<10), strings.Repeat("b", 200<<10), strings.Repeat("c", 100<<10)
	answers := map[string]string{
		"every report": "[" + element(0, first, usage("90", "75000")) + "," + element(1, second, usage("210", "50000")) + ",\n" +
			element(2, third, usage("310", "25000")) + "]\n",
		"one without a report": "[" + element(0, first, usage("90", "75000")) + "," + element(1, second, "") + "," +
			element(2, third, usage("310", "25000")) + "]",
	}
	const headLen = 64 << 10
	for name, answer := range answers {
		whole := metering.NewMeter(metering.FormatCompletions)
		whole.BatchPrompts([]int64{100, 200, 300}, 1)
		whole.Body([]byte(answer))
		want := whole.Result()
		past := metering.NewMeter(metering.FormatCompletions)
		past.BatchPrompts([]int64{100, 200, 300}, 1)
		meterOversized(past, []byte(answer[:headLen]), strings.NewReader(answer[headLen:]), 4<<20)
		got := past.Result()
		if got.Usage != want.Usage || got.Estimated != want.Estimated || got.Reported != want.Reported || got.Model != want.Model ||
			got.OutputChars != want.OutputChars {
			t.Errorf("%s: read past, %+v (reported %v, estimated %v, model %q, %d chars); read whole, %+v (reported %v, estimated %v, model %q, %d chars)",
				name, got.Usage, got.Reported, got.Estimated, got.Model, got.OutputChars, want.Usage, want.Reported, want.Estimated, want.Model, want.OutputChars)
		}
	}
	// Not vacuous: read whole, every report is charged.
	whole := metering.NewMeter(metering.FormatCompletions)
	whole.Body([]byte(answers["every report"]))
	if got := whole.Result(); got.Usage.Input != 90+210+310 || got.Usage.Output != 75000+50000+25000 {
		t.Fatalf("read whole: %+v, want every element's report", got.Usage)
	}

	// Cut in its second element: no report of its own, the text read at its estimate.
	answer := answers["every report"]
	cut := strings.Index(answer, second) + len(second)/2
	past := metering.NewMeter(metering.FormatCompletions)
	meterOversized(past, []byte(answer[:headLen]), strings.NewReader(answer[headLen:cut]), 4<<20)
	if got, text := past.Result(), int64(len(first)+len(second)/2); got.Reported || got.OutputChars != text {
		t.Errorf("cut: %+v (reported %v, %d chars), want no report, %d chars of text for the estimate",
			got.Usage, got.Reported, got.OutputChars, text)
	}
}
