package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskAnswersArrayIsSummed: a llama.cpp server built before it merged a batch's
// answers answers a /v1/completions batch, not streamed, with a JSON array of whole answers,
// each one prompt's task with its own usage. It was read as no answer: no report, and none of
// its text. Every answer's report counts, summed, the sum marked estimated; without a report in
// each, the text of all is there for the estimate. A chat answer is never such an array.
func TestServerTaskAnswersArrayIsSummed(t *testing.T) {
	answer := func(index int, usage string) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion"%s,"id":"chatcmpl-l"}`,
			strings.Repeat("w", 40), index, usage)
	}
	usage := func(prompt, completion int64) string {
		return fmt.Sprintf(`,"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d},"timings":{"prompt_n":%d,"predicted_n":%d}`,
			completion, prompt, prompt+completion, prompt, completion)
	}
	m := NewMeter(FormatCompletions)
	m.Body([]byte(" [" + answer(0, usage(90, 16)) + "," + answer(1, usage(210, 12)) + "]\n"))
	if got, want := m.Result(), (pricing.Usage{Input: 90 + 210, Output: 16 + 12}); got.Usage != want || !got.Reported || !got.Estimated || got.Model != "m" || got.OutputChars != 80 {
		t.Errorf("two answers: got %+v (reported %v, estimated %v, model %q, %d chars), want %+v, reported and estimated, model m, 80 chars",
			got.Usage, got.Reported, got.Estimated, got.Model, got.OutputChars, want)
	}

	m = NewMeter(FormatCompletions)
	m.Body([]byte("[" + answer(0, usage(90, 16)) + "," + answer(1, "") + "]"))
	if got := m.Result(); got.Reported || got.OutputChars != 80 {
		t.Errorf("one answer without a report: got %+v (reported %v, %d chars), want no report and all 80 chars for the estimate", got.Usage, got.Reported, got.OutputChars)
	}

	m = NewMeter(FormatChat)
	m.Body([]byte(`[{"choices":[{"index":0,"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}]`))
	if got := m.Result(); got.Reported || got.OutputChars != 0 {
		t.Errorf("chat array: got %+v (reported %v), want nothing read", got.Usage, got.Reported)
	}
}

// TestServerTaskAnswersSumIsAReportOfTwoFigures: the sum of an array's reports is applied as a
// usage of its prompt_tokens and completion_tokens alone would be read (openAIUsage), without
// writing one out and reading it back: the same report, the same zeros read as none.
func TestServerTaskAnswersSumIsAReportOfTwoFigures(t *testing.T) {
	for _, sum := range [][2]int64{{300, 28}, {0, 5}, {7, 0}, {0, 0}, {pricing.MaxTokens, pricing.MaxTokens}} {
		direct := NewMeter(FormatCompletions)
		direct.summedReport(sum[0], sum[1])
		read := NewMeter(FormatCompletions)
		reported := read.openAIUsage(gjson.Parse(fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d}`, sum[0], sum[1])))
		if got, want := direct.Result(), read.Result(); got.Usage != want.Usage || got.Reported != want.Reported ||
			got.PromptMissing != want.PromptMissing || direct.summedAnswers != reported {
			t.Errorf("sum %v: applied %+v (reported %v, summed %v); read %+v (reported %v)", sum, got.Usage, got.Reported, direct.summedAnswers, want.Usage, reported)
		}
	}
}
