package metering

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// llamaChunk is a chunk of a llama.cpp server chat stream (tools/server/server-task.cpp): one
// choice, as each of the n answers is a task of its own, and no usage.
func llamaChunk(index int, content string) Event {
	return data(fmt.Sprintf(`{"choices":[{"finish_reason":null,"index":%d,"delta":{"content":%q}}],"created":1,"id":"chatcmpl-l","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk"}`, index, content))
}

// llamaFinal is what a llama.cpp server task writes when its answer ends, asked for usage (the
// gateway always asks): the choice's finishing chunk, then a chunk with choices empty and the
// usage of that task, its answer's n_decoded tokens alone
// (server_task_result_cmpl_final::to_json_oaicompat_chat_stream).
func llamaFinal(index int, completion int64) []Event {
	return []Event{
		data(fmt.Sprintf(`{"choices":[{"finish_reason":"stop","index":%d,"delta":{}}],"created":1,"id":"chatcmpl-l","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk"}`, index)),
		data(fmt.Sprintf(`{"choices":[],"created":1,"id":"chatcmpl-l","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk",`+
			`"usage":{"completion_tokens":%d,"prompt_tokens":40,"total_tokens":%d},"timings":{"prompt_n":40,"predicted_n":%d}}`, completion, 40+completion, completion)),
	}
}

// TestServerTaskReportsOfEachChoiceAreSummed: llama.cpp's server reads n as n_cmpl and runs
// each answer as a task of its own (a parent and n-1 children); streamed, every task ends with
// its own finishing chunk and its own usage chunk, choices empty, counting that answer alone.
// The last of them was read as the whole: a call with n = 2 was charged one answer's tokens.
// Each choice's own final report is its count.
func TestServerTaskReportsOfEachChoiceAreSummed(t *testing.T) {
	var events []Event
	events = append(events, llamaChunk(0, "aaaa"), llamaChunk(1, "bbbb"), llamaChunk(0, "aaaa"))
	events = append(events, llamaFinal(0, 30)...)
	events = append(events, llamaChunk(1, "bbbb"))
	events = append(events, llamaFinal(1, 20)...)
	whole := meterEvents(FormatChat, append(events, data(`[DONE]`))...)
	if want := (pricing.Usage{Input: 40, Output: 30 + 20}); whole.Usage != want || !whole.Reported || !whole.Estimated {
		t.Errorf("two answers, each reported apart: got %+v (estimated %v), want %+v, both answers, estimated (the sum is the gateway's)",
			whole.Usage, whole.Estimated, want)
	}

	// One final report, after the last choice's finishing chunk, is the whole (OpenAI's, vLLM's
	// with n > 1): not summed with anything.
	openai := meterEvents(FormatChat, llamaChunk(0, "aaaa"), llamaChunk(1, "bbbb"),
		data(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`),
		data(`{"choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}`),
		data(`{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":7,"total_tokens":47}}`), data(`[DONE]`))
	if want := (pricing.Usage{Input: 40, Output: 7}); openai.Usage != want || openai.Estimated {
		t.Errorf("one final report: got %+v (estimated %v), want %+v, not estimated", openai.Usage, openai.Estimated, want)
	}

	// A proxy's empty usage chunk after the real one follows no finishing chunk: it is no report
	// of a choice, and the one answer is charged once.
	proxied := meterEvents(FormatChat, append(append([]Event{llamaChunk(0, "aaaa")}, llamaFinal(0, 30)...),
		data(`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`), data(`[DONE]`))...)
	if want := (pricing.Usage{Input: 40, Output: 30}); proxied.Usage != want || proxied.Estimated {
		t.Errorf("one answer, a proxy's empty report after: got %+v (estimated %v), want %+v", proxied.Usage, proxied.Estimated, want)
	}
}

// TestRunningUsageOfOneChoiceIsNotSummed: xAI's grok-beta put a running usage, the call's
// count so far, on every chunk of a stream (a captured stream: prompt_tokens 38, then
// completion_tokens 1, 2, ...). One choice reported many times is no sum of choices: a cut
// stream is charged its last report and the text after it, as before.
func TestRunningUsageOfOneChoiceIsNotSummed(t *testing.T) {
	grok := func(content string, completion int64) Event {
		return data(fmt.Sprintf(`{"id":"e409","object":"chat.completion.chunk","created":1732551988,"model":"grok-beta","choices":[{"index":0,"delta":{"content":%q,"role":"assistant"}}],`+
			`"usage":{"prompt_tokens":38,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"text_tokens":38,"audio_tokens":0,"image_tokens":0,"cached_tokens":0}},"system_fingerprint":"fp_6ca29cf396"}`,
			content, completion, 38+completion))
	}
	cut := meterEvents(FormatChat, grok("Coca", 1), grok(" Cola", 2), grok(" is", 3))
	if want := (pricing.Usage{Input: 38, Output: 3}); cut.Usage != want || !cut.Reported || cut.Estimated {
		t.Errorf("cut grok stream: got %+v (estimated %v), want %+v, its last report", cut.Usage, cut.Estimated, want)
	}
}

// llamaCompletionChunk is a chunk of a llama.cpp server /v1/completions stream: one task's
// choice, no usage (server_task_result_cmpl_partial::to_json_oaicompat).
func llamaCompletionChunk(index int, text string) Event {
	return data(fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":null}],"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion","id":"cmpl-l","timings":{"prompt_n":-1}}`, text, index))
}

// llamaCompletionFinal is the one chunk a llama.cpp server task of /v1/completions ends with,
// streamed or not: its choice finishing, and that task's usage and timings beside it, its
// answer's n_decoded tokens alone (server_task_result_cmpl_final::to_json_oaicompat).
func llamaCompletionFinal(index int, completion int64) Event {
	return data(fmt.Sprintf(`{"choices":[{"text":"","index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion",`+
		`"usage":{"completion_tokens":%d,"prompt_tokens":40,"total_tokens":%d},"id":"cmpl-l","timings":{"prompt_n":40,"predicted_n":%d}}`, index, completion, 40+completion, completion))
}

// TestServerTaskReportsOnEachFinishingChunkAreSummed: on /v1/completions, llama.cpp's server
// ends each of the n tasks with a single chunk, its choice's finishing one, which carries that
// answer's usage and the task's timings. The last of them was read as the whole: a call with
// n = 2 was charged one answer's tokens (the same count for both when each ran to its bound).
// Each choice's own report is its count; a server that reports the whole on each finishing
// chunk, with no task timings, is still read as the whole (TestMeterContinuousUsageCountsEveryChoice).
func TestServerTaskReportsOnEachFinishingChunkAreSummed(t *testing.T) {
	whole := meterEvents(FormatCompletions, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"),
		llamaCompletionChunk(0, "aaaa"), llamaCompletionFinal(0, 16), llamaCompletionChunk(1, "bbbb"), llamaCompletionFinal(1, 16), data(`[DONE]`))
	if want := (pricing.Usage{Input: 40, Output: 16 + 16}); whole.Usage != want || !whole.Reported || !whole.Estimated {
		t.Errorf("two answers, each reported on its finishing chunk: got %+v (estimated %v), want %+v, both answers, estimated",
			whole.Usage, whole.Estimated, want)
	}

	// One answer (n = 1): its report is the whole, not estimated.
	one := meterEvents(FormatCompletions, llamaCompletionChunk(0, "aaaa"), llamaCompletionFinal(0, 16), data(`[DONE]`))
	if want := (pricing.Usage{Input: 40, Output: 16}); one.Usage != want || one.Estimated {
		t.Errorf("one answer: got %+v (estimated %v), want %+v, not estimated", one.Usage, one.Estimated, want)
	}
}

// TestServerTaskBodyOfSeveralChoicesChargesEveryChoice: llama.cpp's server answers a call with
// n > 1 (or a completions batch) whole by putting every task's choice into the first task's
// body, whose usage and timings stay that first task's alone (handle_completions_impl). Read as
// the whole, a call with n = 3 was charged one answer's tokens. The report counts the first
// choice; the others' text is charged at its estimate. OpenAI's whole answer with n > 1, whose
// usage counts every choice and carries no task timings, is charged its report.
func TestServerTaskBodyOfSeveralChoicesChargesEveryChoice(t *testing.T) {
	b, c := strings.Repeat("b", 400), strings.Repeat("c", 800)
	body := func(format Format, timings string) Result {
		m := NewMeter(format)
		if format == FormatChat {
			m.Body([]byte(`{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"aaaa"}},` +
				`{"finish_reason":"stop","index":1,"message":{"role":"assistant","content":"` + b + `"}},` +
				`{"finish_reason":"stop","index":2,"message":{"role":"assistant","content":"` + c + `"}}],` +
				`"created":1,"model":"m","object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":40,"total_tokens":42},"id":"chatcmpl-l"` + timings + `}`))
		} else {
			m.Body([]byte(`{"choices":[{"text":"aaaa","index":0,"logprobs":null,"finish_reason":"stop"},` +
				`{"text":"` + b + `","index":1,"logprobs":null,"finish_reason":"stop"},{"text":"` + c + `","index":2,"logprobs":null,"finish_reason":"stop"}],` +
				`"created":1,"model":"m","object":"text_completion","usage":{"completion_tokens":2,"prompt_tokens":40,"total_tokens":42},"id":"cmpl-l"` + timings + `}`))
		}
		return m.Result()
	}
	task := `,"timings":{"prompt_n":40,"predicted_n":2}`
	for _, f := range []Format{FormatChat, FormatCompletions} {
		if got, want := body(f, task), (pricing.Usage{Input: 40, Output: 2 + EstimateOutputTokens(400+800)}); got.Usage != want || !got.Estimated {
			t.Errorf("format %v, llama.cpp's body of three tasks: got %+v (estimated %v), want %+v, the first's report and the others' estimate, estimated",
				f, got.Usage, got.Estimated, want)
		}
		if got, want := body(f, ""), (pricing.Usage{Input: 40, Output: 2}); got.Usage != want || got.Estimated {
			t.Errorf("format %v, a whole report of three choices: got %+v (estimated %v), want %+v, not estimated", f, got.Usage, got.Estimated, want)
		}
	}
}

// TestServerTaskReportOfACutStreamCountsItsChoiceAlone: a llama.cpp stream of n = 2 cut after
// the first task ended has one final report, that task's own (its timings say so). Read as
// the whole, the other answer's text streamed before that report was charged nothing, and only
// what came after it was estimated. The report is its choice's count; every other choice's
// text is charged at its estimate.
func TestServerTaskReportOfACutStreamCountsItsChoiceAlone(t *testing.T) {
	chat := append([]Event{llamaChunk(0, "aaaa"), llamaChunk(1, "bbbb")}, llamaFinal(0, 30)...)
	chat = append(chat, llamaChunk(1, "bbbbbbbb"))
	if got, want := meterEvents(FormatChat, chat...), (pricing.Usage{Input: 40, Output: 30 + EstimateOutputTokens(4+8)}); got.Usage != want || !got.Estimated {
		t.Errorf("chat, cut after one task: got %+v (estimated %v), want %+v, the task's report and all of the other answer's text, estimated",
			got.Usage, got.Estimated, want)
	}
	completions := meterEvents(FormatCompletions, llamaCompletionChunk(0, "aaaa"), llamaCompletionChunk(1, "bbbb"),
		llamaCompletionFinal(0, 16), llamaCompletionChunk(1, "bbbbbbbb"))
	if want := (pricing.Usage{Input: 40, Output: 16 + EstimateOutputTokens(4+8)}); completions.Usage != want || !completions.Estimated {
		t.Errorf("completions, cut after one task: got %+v (estimated %v), want %+v", completions.Usage, completions.Estimated, want)
	}
	// One answer (n = 1): its task's report is the whole, not estimated.
	if one, want := meterEvents(FormatChat, append([]Event{llamaChunk(0, "aaaa")}, llamaFinal(0, 30)...)...), (pricing.Usage{Input: 40, Output: 30}); one.Usage != want || one.Estimated {
		t.Errorf("one answer: got %+v (estimated %v), want %+v, not estimated", one.Usage, one.Estimated, want)
	}
}
