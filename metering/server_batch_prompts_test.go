package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// llamaBatchFinal is the chunk a llama.cpp server task of /v1/completions ends with, streamed
// or whole: its choice (index, the task's: prompt index times n, plus its answer's), and that
// task's usage and timings, its own prompt's n_prompt_tokens and its answer's n_decoded alone
// (server_task_result_cmpl_final::to_json_oaicompat; key order as the server writes them).
func llamaBatchFinal(index int, text string, prompt, completion int64) string {
	return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion",`+
		`"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d},"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":%d,"predicted_n":%d}}`,
		text, index, completion, prompt, prompt+completion, prompt, completion)
}

// meterBatch meters events of a completions call whose prompt is the batch estimates
// estimated, each answered perPrompt times.
func meterBatch(estimates []int64, perPrompt int64, events ...Event) Result {
	m := NewMeter(FormatCompletions)
	m.BatchPrompts(estimates, perPrompt)
	for _, ev := range events {
		m.Event(ev)
	}
	return m.Result()
}

// TestServerTaskReportsOfABatchChargeEveryPrompt: llama.cpp's server runs each prompt of a
// /v1/completions batch (and each of its n answers) as a task of its own, and each task's
// report counts its own prompt alone. Streamed, every task ends with its finishing chunk and
// its report; whole, every task's choice goes into the first task's body, beside that task's
// report alone (handle_completions_impl). The output of every answer was charged, but the
// prompt of one: a batch of three prompts paid for one. Every prompt is charged now, each by its
// task's report where one came and at its estimate where none did, once however many answers
// it had; a server whose report counts the whole batch (no task timings) is charged its report.
func TestServerTaskReportsOfABatchChargeEveryPrompt(t *testing.T) {
	estimates := []int64{100, 200, 300}
	done := data(`[DONE]`)

	// Whole: the first task's report, the other prompts at their estimate.
	b, c := strings.Repeat("b", 40), strings.Repeat("c", 80)
	m := NewMeter(FormatCompletions)
	m.BatchPrompts(estimates, 1)
	m.Body([]byte(`{"choices":[{"text":"aaaa","index":0,"logprobs":null,"finish_reason":"length"},` +
		`{"text":"` + b + `","index":1,"logprobs":null,"finish_reason":"length"},{"text":"` + c + `","index":2,"logprobs":null,"finish_reason":"length"}],` +
		`"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion","usage":{"completion_tokens":1,"prompt_tokens":90,"total_tokens":91},` +
		`"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":90,"predicted_n":1}}`))
	if got, want := m.Result(), (pricing.Usage{Input: 90 + 200 + 300, Output: 1 + EstimateOutputTokens(40+80)}); got.Usage != want || !got.Estimated {
		t.Errorf("whole batch of three: got %+v (estimated %v), want %+v, the first task's report and the others' estimates, estimated", got.Usage, got.Estimated, want)
	}

	// Streamed, every task ended: each prompt its task's report.
	stream := meterBatch(estimates, 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(2, "cccc"), llamaCompletionChunk(1, "bbbb"),
		data(llamaBatchFinal(2, "", 310, 16)), data(llamaBatchFinal(0, "", 90, 16)), data(llamaBatchFinal(1, "", 210, 16)), done)
	if want := (pricing.Usage{Input: 90 + 210 + 310, Output: 3 * 16}); stream.Usage != want || !stream.Estimated {
		t.Errorf("streamed batch of three: got %+v (estimated %v), want %+v, each task's report", stream.Usage, stream.Estimated, want)
	}

	// Two answers a prompt (n = 2): a prompt is charged once, not once an answer.
	twice := meterBatch(estimates[:2], 2, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(3, "dddd"),
		data(llamaBatchFinal(0, "", 90, 8)), data(llamaBatchFinal(3, "", 210, 8)), data(llamaBatchFinal(1, "", 90, 8)), data(llamaBatchFinal(2, "", 210, 8)), done)
	if want := (pricing.Usage{Input: 90 + 210, Output: 4 * 8}); twice.Usage != want || !twice.Estimated {
		t.Errorf("streamed batch of two, n = 2: got %+v (estimated %v), want %+v, each prompt once", twice.Usage, twice.Estimated, want)
	}

	// A prompt its server's cache held is read from the cache, as the last report's is.
	cached := func(index int, prompt, hit int64) Event {
		return data(strings.Replace(llamaBatchFinal(index, "", prompt, 8), `"total_tokens"`,
			fmt.Sprintf(`"prompt_tokens_details":{"cached_tokens":%d},"total_tokens"`, hit), 1))
	}
	hits := meterBatch(estimates[:2], 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"), cached(1, 210, 200), cached(0, 90, 64), done)
	if want := (pricing.Usage{Input: 90 - 64 + 210 - 200, CacheRead: 64 + 200, Output: 2 * 8}); hits.Usage != want || !hits.Estimated {
		t.Errorf("streamed batch of two, cached: got %+v (estimated %v), want %+v", hits.Usage, hits.Estimated, want)
	}

	// Cut after one task ended: its prompt its report, the others their estimates.
	cut := meterBatch(estimates, 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"), data(llamaBatchFinal(1, "", 210, 16)))
	if want := (pricing.Usage{Input: 210 + 100 + 300, Output: 16 + EstimateOutputTokens(4)}); cut.Usage != want || !cut.Estimated {
		t.Errorf("streamed batch cut after one task: got %+v (estimated %v), want %+v", cut.Usage, cut.Estimated, want)
	}

	// A report of the whole batch (OpenAI's, vLLM's: no task timings) is charged as it is.
	whole := meterBatch(estimates, 1, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"), llamaCompletionChunk(2, "cccc"),
		data(`{"choices":[],"usage":{"prompt_tokens":600,"completion_tokens":30,"total_tokens":630}}`), done)
	if want := (pricing.Usage{Input: 600, Output: 30}); whole.Usage != want || whole.Estimated {
		t.Errorf("a report of the whole batch: got %+v (estimated %v), want %+v, not estimated", whole.Usage, whole.Estimated, want)
	}
}

// TestPromptEstimatesCountEachPrompt: each prompt of a batch is estimated as EstimatePrompt
// counts it, a token array by its tokens.
func TestPromptEstimatesCountEachPrompt(t *testing.T) {
	got := PromptEstimates(gjson.Parse(`["` + strings.Repeat("x", 401) + `",[1,2,3],""]`))
	if want := []int64{101, 3, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("estimates %v, want %v", got, want)
	}
}

// TestServerMultimodalPromptIsEstimated: llama.cpp's server takes a completions prompt, or a
// prompt of a batch, as an object of its text and its media ({"prompt_string": ...,
// "multimodal_data": [base64, ...]}; tokenize_input_subprompt), text and images it reads as
// prompt. Such a prompt was estimated at nothing: a batch's prompt the server's report left out
// (a whole answer, which reports its first task alone) was charged 0, and so was the prompt of a
// call without a report. Its text counts as a string prompt's does, each of its media as a media
// part does.
func TestServerMultimodalPromptIsEstimated(t *testing.T) {
	object := `{"prompt_string":"` + strings.Repeat("x", 401) + `","multimodal_data":["AAAA","BBBB"]}`
	got := PromptEstimates(gjson.Parse(`["` + strings.Repeat("y", 40) + `",` + object + `,{"prompt_string":[12,"abcd",34]}]`))
	if want := []int64{10, 101 + 2*tokensPerMedia, 3}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("estimates %v, want %v", got, want)
	}
	whole, _ := EstimatePrompt(FormatCompletions, []byte(`{"model":"m","prompt":`+object+`}`))
	if want := int64(101 + 2*tokensPerMedia); whole < want {
		t.Errorf("a call's object prompt estimated at %d tokens, want at least %d", whole, want)
	}
}
