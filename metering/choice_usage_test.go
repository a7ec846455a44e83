package metering

import (
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// vllmChoiceChunk is a chunk of a vLLM chat stream asked for continuous_usage_stats: one
// choice, and a usage that counts that choice's tokens alone (serving_chat.py sets
// completion_tokens to previous_num_tokens[i]; SGLang and TensorRT-LLM do the same).
func vllmChoiceChunk(index int, content string, completion int64) Event {
	return data(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":%d,"delta":{"content":%q},"logprobs":null,"finish_reason":null}],`+
		`"usage":{"prompt_tokens":50,"total_tokens":%d,"completion_tokens":%d}}`, index, content, 50+completion, completion))
}

// TestMeterContinuousUsageCountsEveryChoice: vLLM's continuous usage with n > 1 reports, on
// each chunk, the count of the one choice the chunk carries; only its final report (choices
// empty) sums the choices. A stream cut before that final report (a caller that leaves, an
// upstream that breaks) was charged the last chunk's choice alone: the other choices' tokens,
// which the provider made and bills, went unbilled. Each choice's last report is its count.
func TestMeterContinuousUsageCountsEveryChoice(t *testing.T) {
	start := []Event{
		vllmChoiceChunk(0, "", 0), vllmChoiceChunk(1, "", 0),
		vllmChoiceChunk(0, "aaaa", 1), vllmChoiceChunk(1, "bbbb", 1),
		vllmChoiceChunk(0, "aaaa", 2), vllmChoiceChunk(1, "bbbb", 2),
		vllmChoiceChunk(0, "aaaa", 3),
	}
	cut := meterEvents(FormatChat, start...)
	if want := (pricing.Usage{Input: 50, Output: 3 + 2}); cut.Usage != want || !cut.Reported || !cut.Estimated {
		t.Errorf("cut before the final report: got %+v (estimated %v), want %+v, each choice's last count, estimated",
			cut.Usage, cut.Estimated, want)
	}

	whole := meterEvents(FormatChat, append(start,
		vllmChoiceChunk(1, "bbbb", 3),
		data(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":50,"total_tokens":57,"completion_tokens":7}}`),
		data(`[DONE]`))...)
	if want := (pricing.Usage{Input: 50, Output: 7}); whole.Usage != want || !whole.Reported || whole.Estimated {
		t.Errorf("whole stream: got %+v (estimated %v), want %+v, its final report, not estimated", whole.Usage, whole.Estimated, want)
	}

	// Text a choice streamed after its own last report is charged at its estimate, as the
	// text after the last report of a one-choice stream is.
	tail := meterEvents(FormatChat, append(start[:len(start):len(start)],
		data(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":1,"delta":{"content":"bbbbbbbb"},"finish_reason":null}]}`))...)
	if want := (pricing.Usage{Input: 50, Output: 3 + 2 + EstimateOutputTokens(8)}); tail.Usage != want || !tail.Estimated {
		t.Errorf("text after a choice's report: got %+v (estimated %v), want %+v, estimated", tail.Usage, tail.Estimated, want)
	}

	// A server that reports the whole once on each choice's finishing chunk reports no choice
	// apart: its last report is the whole count, not summed.
	finish := func(index int) Event {
		return data(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":%d,"delta":{"content":""},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":50,"total_tokens":70,"completion_tokens":20}}`, index))
	}
	twice := meterEvents(FormatChat, data(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"aaaa"}}]}`),
		data(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":1,"delta":{"content":"bbbb"}}]}`),
		finish(0), finish(1), data(`[DONE]`))
	if want := (pricing.Usage{Input: 50, Output: 20}); twice.Usage != want || twice.Estimated {
		t.Errorf("the whole reported on each finishing chunk: got %+v (estimated %v), want %+v, not estimated", twice.Usage, twice.Estimated, want)
	}

	// One choice (n = 1): its last report is the whole count, as before.
	one := meterEvents(FormatChat, vllmChoiceChunk(0, "", 0), vllmChoiceChunk(0, "aaaa", 1), vllmChoiceChunk(0, "aaaa", 2))
	if want := (pricing.Usage{Input: 50, Output: 2}); one.Usage != want || one.Estimated {
		t.Errorf("one choice: got %+v (estimated %v), want %+v, not estimated", one.Usage, one.Estimated, want)
	}
}

// TestMeterChoiceReportOfATotalAloneCountsItsOutput: a report on a chunk of one choice that
// gives the prompt and the total but no completion_tokens counts that choice's output as their
// difference, as a whole report without completion_tokens does. Read as no output, a stream cut
// before its final report was charged the last chunk's choice alone, the others unbilled.
func TestMeterChoiceReportOfATotalAloneCountsItsOutput(t *testing.T) {
	chunk := func(index int, content string, completion int64) Event {
		return data(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":%d,"delta":{"content":%q}}],`+
			`"usage":{"prompt_tokens":50,"total_tokens":%d}}`, index, content, 50+completion))
	}
	got := meterEvents(FormatChat, chunk(0, "aaaa", 1), chunk(1, "bbbb", 1), chunk(0, "aaaa", 2), chunk(1, "bbbb", 2), chunk(0, "aaaa", 3))
	if want := (pricing.Usage{Input: 50, Output: 3 + 2}); got.Usage != want || !got.Estimated {
		t.Errorf("got %+v (estimated %v), want %+v, each choice's last total less the prompt, estimated", got.Usage, got.Estimated, want)
	}
}

// TestMeterChoiceIndexPastTheLedgerIsOneOfSeveral: a chunk's choice index is the upstream's
// word, and the ledger keeps no more than maxLedgerChoices apart: a chunk naming an index past
// it (a hostile or broken upstream's 2^50) counts as a chunk of several choices. Kept apart, the
// ledger was grown to the index named, a slice no process can allocate, on the call's path.
func TestMeterChoiceIndexPastTheLedgerIsOneOfSeveral(t *testing.T) {
	far := int64(1) << 50
	got := meterEvents(FormatChat,
		data(fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":%d,"delta":{"content":"aaaa"}}],`+
			`"usage":{"prompt_tokens":50,"total_tokens":53,"completion_tokens":3}}`, far)),
		data(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":50,"total_tokens":53,"completion_tokens":3}}`),
		data(`[DONE]`))
	if want := (pricing.Usage{Input: 50, Output: 3}); got.Usage != want || got.Estimated || got.OutputChars != 4 {
		t.Errorf("got %+v (estimated %v, %d chars), want %+v from the final report, 4 chars", got.Usage, got.Estimated, got.OutputChars, want)
	}
}

// TestMeterChoiceReportThatFallsKeepsItsCount: a choice's count is cumulative: a later report
// on a chunk of the same choice that counts less (a 0, as a proxy's empty usage on a chunk it
// appends) is no count, as a 0 after a count is for the whole report. Taken, the choice's
// tokens the provider made and bills went unbilled once the stream was cut.
func TestMeterChoiceReportThatFallsKeepsItsCount(t *testing.T) {
	got := meterEvents(FormatChat,
		vllmChoiceChunk(0, "aaaa", 1), vllmChoiceChunk(1, "bbbb", 1),
		vllmChoiceChunk(0, "aaaa", 2), vllmChoiceChunk(1, "bbbb", 2),
		vllmChoiceChunk(0, "aaaa", 3),
		data(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":1,"delta":{"content":""}}],"usage":{"prompt_tokens":0,"total_tokens":0,"completion_tokens":0}}`))
	if want := (pricing.Usage{Input: 50, Output: 3 + 2}); got.Usage != want || !got.Estimated {
		t.Errorf("got %+v (estimated %v), want %+v, each choice's largest count, estimated", got.Usage, got.Estimated, want)
	}
}
