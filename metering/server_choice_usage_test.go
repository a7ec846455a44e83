package metering

import (
	"fmt"
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
