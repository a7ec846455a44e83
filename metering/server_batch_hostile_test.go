package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskAnswersArrayReportsOnlyWhatEveryAnswerSays: an array of whole answers
// (taskAnswers) is a report only when it holds answers and each says both its prompt and its
// completion tokens, each counted from 0 up: an empty array is no report (charged the prompt's
// estimate, not 0), nor is one whose answer leaves out its completion (its text is estimated,
// not charged 0 output), a negative figure counts as none rather than taking from the others',
// and an element that is no answer (a null, a number) is passed over, not taken for an answer
// without a report.
func TestServerTaskAnswersArrayReportsOnlyWhatEveryAnswerSays(t *testing.T) {
	answer := func(index int, usage string) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","object":"text_completion","usage":%s,"id":"cmpl-l"}`,
			strings.Repeat("w", 40), index, usage)
	}
	read := func(body string) Result {
		m := NewMeter(FormatCompletions)
		m.Body([]byte(body))
		return m.Result()
	}
	if got := read(`[]`); got.Reported {
		t.Errorf("empty array: reported %+v, want no report", got.Usage)
	}
	if got := read("[" + answer(0, `{"prompt_tokens":90,"completion_tokens":16}`) + "," + answer(1, `{"prompt_tokens":210}`) + "]"); got.Reported {
		t.Errorf("an answer without its completion tokens: reported %+v, want no report (its text estimated)", got.Usage)
	}
	got := read("[" + answer(0, `{"prompt_tokens":-500,"completion_tokens":-7}`) + "," + answer(1, `{"prompt_tokens":210,"completion_tokens":12}`) + "]")
	if want := (pricing.Usage{Input: 210, Output: 12}); !got.Reported || got.Usage != want {
		t.Errorf("negative figures in one answer: got %+v (reported %v), want %+v, the other answer's", got.Usage, got.Reported, want)
	}
	got = read("[" + answer(0, `{"prompt_tokens":90,"completion_tokens":16}`) + ",null,7]")
	if want := (pricing.Usage{Input: 90, Output: 16}); !got.Reported || got.Usage != want {
		t.Errorf("an answer beside elements that are none: got %+v (reported %v), want %+v, its report", got.Usage, got.Reported, want)
	}
}

// TestServerTaskReportOfABatchCachingMoreThanItsPromptCountsItsPrompt: a task's report whose
// cached tokens say more than its prompt (a server's miscount) reads its whole prompt from the
// cache, no more: the batch's input is not lowered below the other prompts' by it.
func TestServerTaskReportOfABatchCachingMoreThanItsPromptCountsItsPrompt(t *testing.T) {
	cached := func(index int, prompt, hit int64) Event {
		return data(strings.Replace(llamaBatchFinal(index, "", prompt, 8), `"total_tokens"`,
			fmt.Sprintf(`"prompt_tokens_details":{"cached_tokens":%d},"total_tokens"`, hit), 1))
	}
	got := meterBatch([]int64{100, 200}, 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"),
		cached(1, 210, 300), cached(0, 90, 0), data(`[DONE]`))
	if want := (pricing.Usage{Input: 90, CacheRead: 210, Output: 2 * 8}); got.Usage != want {
		t.Errorf("a task's report caching more than its prompt: got %+v, want %+v", got.Usage, want)
	}
}

// TestServerTaskReportOfAChoicePastTheBatchIsNoTaskOfIt: a task's report on the finishing chunk
// of a choice whose index is past the batch's prompts (a server that numbers its choices
// otherwise, or a hostile one) names no prompt of the batch: it is read as it says, without
// a prompt's part — and does not take the meter past the batch's end.
func TestServerTaskReportOfAChoicePastTheBatchIsNoTaskOfIt(t *testing.T) {
	got := meterBatch([]int64{100, 200}, 1, llamaCompletionChunk(0, "aaaa"), data(llamaBatchFinal(2, "", 90, 8)), data(`[DONE]`))
	if !got.Reported || got.Usage.Input != 90 {
		t.Errorf("a report of choice 2 of a batch of two prompts: got %+v (reported %v), want its own 90 input tokens", got.Usage, got.Reported)
	}
}

// TestReportOfTheWholeBatchAfterATasksOwnAddsNoPrompts: a stream whose task's own report (one
// prompt's) is followed by a report of the whole batch (its usage chunk at the end, all the
// prompts counted) is charged the batch's prompts as that last report says: the others are not
// added again at their estimates, as they are when a task's report is the last.
func TestReportOfTheWholeBatchAfterATasksOwnAddsNoPrompts(t *testing.T) {
	got := meterBatch([]int64{100, 200, 300}, 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"), llamaCompletionChunk(2, "cccc"),
		data(llamaBatchFinal(0, "", 90, 8)),
		data(`{"choices":[],"usage":{"prompt_tokens":600,"completion_tokens":30,"total_tokens":630}}`), data(`[DONE]`))
	if got.Usage.Input != 600 {
		t.Errorf("a whole batch's report after a task's own: input %d, want 600, the last report's", got.Usage.Input)
	}
}
