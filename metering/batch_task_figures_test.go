package metering

import (
	"strings"
	"testing"
)

// TestBatchTaskReportsKeepNoNegativeFigure: every figure a report leaves the Meter (reported,
// and through batchTaskReport a batch's taskPrompts, which otherPrompts sums) is in
// [0, pricing.MaxTokens], however the report gives it: a negative number, a negative fraction,
// a huge negative, a string of one, in an OpenAI-shaped task report or in llama.cpp's server's
// own shape, streamed or whole. A negative prompt left there would take from the other prompts'
// charge (otherPrompts clamps them again all the same: the clamp at the report, tokenCount's,
// is the one this pins, its own never reached).
func TestBatchTaskReportsKeepNoNegativeFigure(t *testing.T) {
	hostile := []string{`-500`, `-0.5`, `-1e30`, `"-3"`, `-9223372036854775808`}
	for _, n := range hostile {
		openAI := func(index int) string {
			f := llamaBatchFinal(index, "", 90, 8)
			f = strings.Replace(f, `"prompt_tokens":90`, `"prompt_tokens":`+n, 1)
			return strings.Replace(f, `"total_tokens"`, `"prompt_tokens_details":{"cached_tokens":`+n+`},"total_tokens"`, 1)
		}
		own := `{"content":"","tokens_evaluated":` + n + `,"tokens_predicted":8,"stop":true,"index":2}`
		for name, feed := range map[string]func(m *Meter){
			"streamed OpenAI-shaped task reports": func(m *Meter) {
				for _, ev := range []Event{llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"),
					data(openAI(1)), data(openAI(2)), data(llamaBatchFinal(0, "", 90, 8)), data(`[DONE]`)} {
					m.Event(ev)
				}
			},
			"streamed own-shape task reports": func(m *Meter) {
				for _, ev := range []Event{data(own), data(`{"content":"","tokens_evaluated":90,"tokens_predicted":8,"stop":true,"index":0}`)} {
					m.Event(ev)
				}
			},
			"whole answer with its first task's report": func(m *Meter) {
				m.Body([]byte(strings.Replace(openAI(0), `"choices":[`, `"choices":[{"text":"bbbb","index":1,"logprobs":null,"finish_reason":"length"},`, 1)))
			},
		} {
			m := NewMeter(FormatCompletions)
			m.BatchPrompts([]int64{100, 200, 300}, 1)
			feed(m)
			for i, f := range m.reported {
				if f.n < 0 {
					t.Errorf("%s, figures %s: reported figure %d is %d, want at least 0", name, n, i, f.n)
				}
			}
			for p, tp := range m.taskPrompts {
				if tp.tokens < 0 || tp.cached < 0 {
					t.Errorf("%s, figures %s: prompt %d's task report kept %+v, want no negative figure", name, n, p, tp)
				}
			}
			if input, cached := m.otherPrompts(); input < 0 || cached < 0 {
				t.Errorf("%s, figures %s: the other prompts are %d input and %d cached, want neither negative", name, n, input, cached)
			}
		}
	}
}
