package metering

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// A null count is no count: a later report that sends "prompt_tokens": null (or a null cached
// count, or Anthropic's output_tokens) keeps the figure an earlier report gave. Read as 0, the
// prompt of the stream below went unbilled, its cached part was billed at the full input
// price, and an Anthropic answer cut before its final count was billed no output at all.
func TestMeterNullFigureIsNoFigure(t *testing.T) {
	got := meterEvents(FormatChat,
		data(`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":40}}}`),
		data(`{"choices":[],"usage":{"prompt_tokens":null,"completion_tokens":30,"total_tokens":null,
			"prompt_tokens_details":{"cached_tokens":null}}}`))
	if want := (pricing.Usage{Input: 60, CacheRead: 40, Output: 30}); got.Usage != want || got.PromptMissing {
		t.Errorf("OpenAI-style: got %+v, want usage %+v, the prompt not missing", got, want)
	}

	got = meterEvents(FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":null,"completion_tokens":30,"total_tokens":1030}}`))
	if want := (pricing.Usage{Input: 1000, Output: 30}); got.Usage != want {
		t.Errorf("a null prompt beside the completion and the total: got %+v, want %+v", got.Usage, want)
	}

	text := data(`{"type":"content_block_delta","delta":{"type":"text_delta","text":"` + strings.Repeat("x", 400) + `"}}`)
	got = meterEvents(FormatAnthropic,
		data(`{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`), text,
		data(`{"type":"message_delta","usage":{"output_tokens":null}}`))
	if est := EstimateOutputTokens(400); got.Usage.Output != est || !got.Estimated {
		t.Errorf("Anthropic null output_tokens: got %+v, want the streamed text's estimate %d, estimated", got, est)
	}
}

// A router that gives its cache writes under several names gives the one count under each:
// the largest of them is the count, whichever name comes first. A zero under OpenAI's name
// (a schema that fills in every field) beside LiteLLM's top-level count read as 0, and the
// writes were billed at the input price, below the provider's cache-write price.
func TestMeterCacheWritesLargestOfTheirNames(t *testing.T) {
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":20,"total_tokens":1020,
		"prompt_tokens_details":{"cached_tokens":100,"cache_write_tokens":0},"cache_creation_input_tokens":600}}`))
	if want := (pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, Output: 20}); m.Result().Usage != want {
		t.Errorf("got %+v, want %+v", m.Result().Usage, want)
	}
}

// A chat report of the total alone says nothing of the split: all of it is billed as output,
// the dearer side, never less than the provider charged. Read as the prompt, the call was
// billed at the input price, a fraction of the output's.
func TestMeterChatTotalAloneIsOutput(t *testing.T) {
	got := meterEvents(FormatChat, data(`{"choices":[],"usage":{"total_tokens":500}}`))
	if want := (pricing.Usage{Output: 500}); got.Usage != want || !got.Reported || got.PromptMissing || !got.Estimated {
		t.Errorf("got %+v, want usage %+v reported, the prompt not missing, estimated (the split is the gateway's)", got, want)
	}
	price := pricing.Price{Input: 1_000_000, Output: 4_000_000}
	if got, least := price.Cost(got.Usage), price.Cost(pricing.Usage{Input: 500}); got < least {
		t.Errorf("charged %d micro-USD, below the %d of the total read as input", got, least)
	}
}

// Moonshot's usage rides on the finishing choice: with n > 1 that need not be the first
// choice of the chunk. Looked for in the first alone, the report was missed and the call
// charged its prompt's estimate.
func TestMeterReadsUsageInALaterChoice(t *testing.T) {
	got := meterEvents(FormatChat,
		data(`{"object":"chat.completion.chunk","model":"kimi-k2.5","choices":[{"index":0,"delta":{},"finish_reason":null},
			{"index":1,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}]}`),
		data(`[DONE]`))
	if want := (pricing.Usage{Input: 12, Output: 9}); got.Usage != want || !got.Reported {
		t.Errorf("got %+v, want usage %+v reported", got, want)
	}
}

// The data's "type" says what an event is; the SSE event name stands in only when a relay
// dropped the type. A relay that names every event alike ("event: message", the SSE default
// name) left each typed event unread when the name won: the Anthropic and Responses streams
// below were charged their prompts' estimates.
func TestMeterTypeWinsOverTheEventName(t *testing.T) {
	ev := func(s string) Event { return Event{Name: "message", Data: []byte(s)} }
	got := meterEvents(FormatAnthropic,
		ev(`{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}`),
		ev(`{"type":"message_delta","usage":{"output_tokens":42}}`))
	if want := (pricing.Usage{Input: 10, CacheRead: 5, Output: 42}); got.Usage != want || !got.Reported || got.Estimated {
		t.Errorf("Anthropic: got %+v, want usage %+v reported, not estimated", got, want)
	}
	got = meterEvents(FormatResponses,
		ev(`{"type":"response.completed","response":{"usage":{"input_tokens":7,"output_tokens":3,"input_tokens_details":{"cached_tokens":2}}}}`))
	if want := (pricing.Usage{Input: 5, CacheRead: 2, Output: 3}); got.Usage != want || !got.Reported {
		t.Errorf("Responses: got %+v, want usage %+v reported", got, want)
	}
}

// An Anthropic body without a usage report (an Anthropic-compatible server that gives none)
// is billed the estimate of what it carries: its thinking is output the model generated, as
// its text and its tool input are. Left out, an answer that thought at length was billed its
// few words of text.
func TestMeterAnthropicBodyWithoutUsageCountsItsThinking(t *testing.T) {
	m := NewMeter(FormatAnthropic)
	m.Body([]byte(`{"type":"message","content":[{"type":"thinking","thinking":"` + strings.Repeat("t", 4000) + `","signature":"x"},
		{"type":"text","text":"42"}]}`))
	if got := m.Result(); got.Reported || got.OutputChars != 4002 {
		t.Errorf("got %+v, want no report and 4002 bytes of output (the thinking and the text)", got)
	}
}

// An OpenAI-shaped report that gives no output figure — completion_tokens (output_tokens)
// absent, null, or no number, and no total — says nothing of the output, as one without
// prompt_tokens says nothing of the prompt: the output is the estimate of the text the answer
// carried, marked estimated, as Anthropic's missing final count is. Read as 0, an answer of a
// thousand tokens was billed its prompt alone.
func TestMeterReportWithoutOutputFigureBillsTheOutputEstimate(t *testing.T) {
	text := strings.Repeat("x", 4000)
	est := EstimateOutputTokens(int64(len(text)))
	chat := data(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`)
	for _, usage := range []string{`{"prompt_tokens":10}`, `{"prompt_tokens":10,"completion_tokens":null}`,
		`{"prompt_tokens":10,"completion_tokens":"many"}`, `{"input_tokens":10}`} {
		got := meterEvents(FormatChat, chat, data(`{"choices":[],"usage":`+usage+`}`))
		if want := (pricing.Usage{Input: 10, Output: est}); got.Usage != want || !got.Reported || !got.Estimated {
			t.Errorf("chat %s: got %+v, want usage %+v reported, estimated", usage, got, want)
		}
	}
	got := meterEvents(FormatCompletions, data(`{"choices":[{"index":0,"text":"`+text+`"}]}`),
		data(`{"choices":[],"usage":{"prompt_tokens":10}}`))
	if want := (pricing.Usage{Input: 10, Output: est}); got.Usage != want || !got.Estimated {
		t.Errorf("completions: got %+v, want usage %+v, estimated", got, want)
	}
	got = meterEvents(FormatResponses, data(`{"type":"response.output_text.delta","delta":"`+text+`"}`),
		data(`{"type":"response.completed","response":{"usage":{"input_tokens":10}}}`))
	if want := (pricing.Usage{Input: 10, Output: est}); got.Usage != want || !got.Estimated {
		t.Errorf("responses: got %+v, want usage %+v, estimated", got, want)
	}
	// A report with its output figure, 0 included, is the provider's word: no estimate.
	got = meterEvents(FormatChat, chat, data(`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":0}}`))
	if want := (pricing.Usage{Input: 10}); got.Usage != want || got.Estimated {
		t.Errorf("completion_tokens 0: got %+v, want usage %+v, not estimated", got, want)
	}
	// Nor is a report of the prompt alone for an answer that carried nothing (a failed one).
	got = meterEvents(FormatResponses, data(`{"type":"response.failed","response":{"usage":{"input_tokens":10}}}`))
	if want := (pricing.Usage{Input: 10}); got.Usage != want || got.Estimated {
		t.Errorf("responses, nothing produced: got %+v, want usage %+v, not estimated", got, want)
	}
	// An embedding has no output: its prompt alone is no missing output.
	m := NewMeter(FormatEmbeddings)
	m.Body([]byte(`{"object":"list","data":[],"usage":{"prompt_tokens":10}}`))
	if got := m.Result(); got.Usage != (pricing.Usage{Input: 10}) || got.Estimated {
		t.Errorf("embeddings: got %+v, want input 10, not estimated", got)
	}
}

// A count with a fraction (a compatible server that averages, or writes 1.5e3) is rounded up,
// as every figure of a charge is (pricing.Cost): truncated, a report of 0.9 output tokens
// billed none, and the gateway billed less than the provider's word.
func TestMeterFractionalCountRoundsUp(t *testing.T) {
	got := meterEvents(FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":10.5,"completion_tokens":0.9,"total_tokens":1.2e1}}`))
	if want := (pricing.Usage{Input: 11, Output: 1}); got.Usage != want {
		t.Errorf("chat: got %+v, want %+v", got.Usage, want)
	}
	got = meterEvents(FormatAnthropic, data(`{"type":"message_start","message":{"usage":{"input_tokens":2.5,"cache_read_input_tokens":-0.5,"output_tokens":1}}}`),
		data(`{"type":"message_delta","usage":{"output_tokens":7.01}}`))
	if want := (pricing.Usage{Input: 3, Output: 8}); got.Usage != want {
		t.Errorf("anthropic: got %+v, want %+v", got.Usage, want)
	}
}

// A count written as a string holding a number ("5000", as some compatible servers and
// proxies serialise them) is that count. Read as absent, an Anthropic-shaped report's cache
// writes and reads went unbilled (input_tokens leaves them out), and an OpenAI-shaped one's
// cached tokens were billed at the full input price.
func TestMeterCountInAStringIsTheCount(t *testing.T) {
	m := NewMeter(FormatAnthropic)
	m.Body([]byte(`{"type":"message","content":[{"type":"text","text":"hi"}],
		"usage":{"input_tokens":3,"cache_creation_input_tokens":"5000","cache_read_input_tokens":" 100 ","output_tokens":"9.5"}}`))
	if got, want := m.Result(), (pricing.Usage{Input: 3, CacheRead: 100, CacheWrite: 5000, Output: 10}); got.Usage != want || got.Estimated {
		t.Errorf("anthropic: got %+v, want usage %+v, not estimated", got, want)
	}
	got := meterEvents(FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":"5000","completion_tokens":"900",
		"prompt_tokens_details":{"cached_tokens":"4000"}}}`))
	if want := (pricing.Usage{Input: 1000, CacheRead: 4000, Output: 900}); got.Usage != want || got.Estimated || got.PromptMissing {
		t.Errorf("chat: got %+v, want usage %+v, not estimated", got, want)
	}
	// A string that is no number is no count; one below zero counts 0, as a number does.
	got = meterEvents(FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":"n/a","total_tokens":"12 tokens",
		"prompt_tokens_details":{"cached_tokens":"-4"}}}`))
	if want := (pricing.Usage{Input: 10}); got.Usage != want {
		t.Errorf("strings that are no count: got %+v, want usage %+v", got.Usage, want)
	}
	if got := meterEvents(FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":"1e30","completion_tokens":"99999999999999999999999"}}`)).Usage; got.Input != pricing.MaxTokens || got.Output != pricing.MaxTokens {
		t.Errorf("huge counts in strings: got %+v, want both at MaxTokens", got)
	}
}

// A whole Anthropic answer whose usage gives no output count — output_tokens absent, null or
// not a number, as an Anthropic-compatible server may write it — says nothing of the output,
// as the same answer streamed without its final count does: the output is the estimate of the
// text it carried, marked estimated. The whole answer's usage was taken as final, and its
// output billed 0.
func TestMeterAnthropicBodyWithoutOutputCountBillsTheOutputEstimate(t *testing.T) {
	text := strings.Repeat("x", 4000)
	est := EstimateOutputTokens(int64(len(text)))
	for _, usage := range []string{`{"input_tokens":10}`, `{"input_tokens":10,"output_tokens":null}`,
		`{"input_tokens":10,"output_tokens":"n/a"}`, `{"iterations":[{"input_tokens":10}]}`} {
		m := NewMeter(FormatAnthropic)
		m.Body([]byte(`{"type":"message","model":"m","content":[{"type":"text","text":"` + text + `"}],"usage":` + usage + `}`))
		if want := (pricing.Usage{Input: 10, Output: est}); m.Result().Usage != want || !m.Result().Estimated {
			t.Errorf("body %s: got %+v, want usage %+v, estimated", usage, m.Result(), want)
		}
		if m.Result().StartOnly {
			t.Errorf("body %s: StartOnly set on a whole answer's usage (it names a stream's message_start alone)", usage)
		}
		streamed := meterEvents(FormatAnthropic, data(`{"type":"message_start","message":{"model":"m","usage":{"input_tokens":10}}}`),
			data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}`),
			data(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":`+usage+`}`))
		if want := (pricing.Usage{Input: 10, Output: est}); streamed.Usage != want || !streamed.Estimated {
			t.Errorf("stream %s: got %+v, want usage %+v, estimated", usage, streamed, want)
		}
	}
	// A count, 0 included, is the provider's word: no estimate.
	for _, usage := range []string{`{"input_tokens":10,"output_tokens":0}`, `{"iterations":[{"input_tokens":10,"output_tokens":0}]}`} {
		m := NewMeter(FormatAnthropic)
		m.Body([]byte(`{"type":"message","content":[{"type":"text","text":"` + text + `"}],"usage":` + usage + `}`))
		if got := m.Result(); got.Usage != (pricing.Usage{Input: 10}) || got.Estimated {
			t.Errorf("body %s: got %+v, want input 10, not estimated", usage, got)
		}
	}
}

// TestMeterTextAfterTheLastReportIsEstimated: a report counts the output up to the chunk it
// rides on. Text streamed after the last one (a provider that reported early, a stream cut
// before its final report) is charged at its estimate on top of the output reported, in the
// chat and completions formats, and the result says so; an early report without an output
// figure already bills the estimate of all the text, which is not added twice. A report after
// the text is the whole count: nothing is added.
func TestMeterTextAfterTheLastReportIsEstimated(t *testing.T) {
	text := strings.Repeat("x", 4000)
	est := EstimateOutputTokens(int64(len(text)))
	early := data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":5,"total_tokens":1005}}`)
	for _, tc := range []struct {
		name   string
		f      Format
		events []Event
		want   pricing.Usage
		est    bool
	}{
		{"chat, text after an early report", FormatChat,
			[]Event{early, data(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`)},
			pricing.Usage{Input: 1000, Output: 5 + est}, true},
		{"completions, text after an early report", FormatCompletions,
			[]Event{early, data(`{"choices":[{"index":0,"text":"` + text + `"}]}`)},
			pricing.Usage{Input: 1000, Output: 5 + est}, true},
		{"chat, text after an early report without an output figure", FormatChat,
			[]Event{data(`{"choices":[],"usage":{"prompt_tokens":1000}}`), data(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`)},
			pricing.Usage{Input: 1000, Output: est}, true},
		{"chat, the report after the text", FormatChat,
			[]Event{data(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`), data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":900}}`)},
			pricing.Usage{Input: 1000, Output: 900}, false},
	} {
		got := meterEvents(tc.f, tc.events...)
		if got.Usage != tc.want || !got.Reported || got.Estimated != tc.est {
			t.Errorf("%s: got %+v, want usage %+v reported, estimated %v", tc.name, got, tc.want, tc.est)
		}
	}
}
