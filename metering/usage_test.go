package metering

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

func TestIsUsageOnlyChunk(t *testing.T) {
	for _, tc := range []struct {
		data string
		want bool
	}{
		{`{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, true},
		{`{"choices": [ ], "usage" : {}}`, true},
		{`{"usage":{"prompt_tokens":1},"object":"text_completion","choices":[]}`, true},
		{`{"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":1}}`, false}, // usage on a content chunk
		{`{"choices":[],"usage":null}`, false},
		{`{"choices":[]}`, false},                 // Azure's prompt_filter_results chunk
		{`{"usage":{"prompt_tokens":1}}`, false},  // no choices at all
		{`{"choices":{},"usage":{"a":1}}`, false}, // choices not an array
		{`{"choices":[],"usage":{"prompt_tokens":1},"error":{"message":"x"}}`, false},
		{`{"choices":[],"usage":{"prompt_tokens":1},"error":null}`, true},
		{`[DONE]`, false},
		{``, false},
		{`{"choices":[],"usage":`, false},
		{"{\"choices\" :\n[\t],\"usage\":{\"prompt_tokens\":1}}", true},                     // whitespace anywhere JSON allows
		{`{"model":"choices","choices":[],"usage":{"prompt_tokens":1}}`, true},              // "choices" as a value first
		{`{"choices":[{"delta":{"content":"choices"}}],"usage":null}`, false},               // an ordinary chunk
		{`{"x":{"choices":[]},"choices":[{"index":0}],"usage":{"prompt_tokens":1}}`, false}, // empty only when nested
	} {
		if got := IsUsageOnlyChunk([]byte(tc.data)); got != tc.want {
			t.Errorf("IsUsageOnlyChunk(%s) = %v, want %v", tc.data, got, tc.want)
		}
	}
}

func TestIsFinalEvent(t *testing.T) {
	for _, tc := range []struct {
		f    Format
		ev   Event
		want bool
	}{
		{FormatChat, data("[DONE]"), true},
		{FormatChat, data(" [DONE]\n"), true},
		{FormatCompletions, data("[DONE]"), true},
		{FormatChat, data(`{"choices":[],"usage":{"prompt_tokens":1}}`), false},
		{FormatAnthropic, Event{Name: "message_stop", Data: []byte(`{"type":"message_stop"}`)}, true},
		{FormatAnthropic, Event{Name: "message_delta", Data: []byte(`{"type":"message_delta","usage":{}}`)}, false},
		{FormatResponses, Event{Name: "response.completed", Data: []byte(`{"type":"response.completed"}`)}, true},
		{FormatResponses, Event{Data: []byte(`{"type":"response.incomplete"}`)}, true},
		{FormatResponses, Event{Data: []byte(`{"type":"response.failed"}`)}, true},
		{FormatResponses, Event{Data: []byte(`{"type":"response.output_text.delta","delta":"[DONE]"}`)}, false},
		{FormatResponses, data("[DONE]"), false},
	} {
		if got := IsFinalEvent(tc.f, tc.ev); got != tc.want {
			t.Errorf("IsFinalEvent(%v, %s %s) = %v, want %v", tc.f, tc.ev.Name, tc.ev.Data, got, tc.want)
		}
	}
}

func meterEvents(f Format, events ...Event) Result {
	m := NewMeter(f)
	for _, ev := range events {
		m.Event(ev)
	}
	return m.Result()
}

func data(s string) Event { return Event{Data: []byte(s)} }

func TestMeterOpenAI(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []Event
		want   pricing.Usage
		rep    bool
		err    bool
	}{
		{"last usage wins, never summed", []Event{
			data(`{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`),
			data(`{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`),
			data(`[DONE]`),
		}, pricing.Usage{Input: 10, Output: 2}, true, false},
		{"a later report without the prompt keeps it", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":5000,"total_tokens":8000}}`),
			data(`{"choices":[],"usage":{"completion_tokens":5000}}`),
		}, pricing.Usage{Input: 3000, Output: 5000}, true, false},
		{"a later report without details keeps the cached count", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":800}}}`),
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":40}}`),
		}, pricing.Usage{Input: 200, CacheRead: 800, Output: 40}, true, false},
		{"a later report's figures replace earlier ones, also downwards", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":5}}}`),
			data(`{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}`),
		}, pricing.Usage{Input: 10, Output: 7}, true, false},
		// A cumulative count cannot fall to nothing: a trailing report's 0 (a router's last
		// chunk that repeats the output count alone) is no count of any figure an earlier
		// report gave, the prompt's parts, the output's audio and the total (reasoning left
		// out of the completion, as xAI's) included. (A report of zeros alone is none at all.)
		// A cumulative count cannot fall to nothing: a trailing report's 0 (a router's last
		// chunk that repeats one count and zeroes the rest) is no count of a figure an earlier
		// report gave, nor of its parts: the prompt's, the output's audio, and the total
		// (reasoning left out of the completion, as xAI's). (A report of zeros alone is none.)
		{"a trailing report's zeros keep the prompt, the output and their parts", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":300,"total_tokens":1500,
				"prompt_tokens_details":{"cached_tokens":500,"cache_write_tokens":200,"audio_tokens":100,
					"cache_creation_token_details":{"ephemeral_1h_input_tokens":50}},
				"completion_tokens_details":{"audio_tokens":250}}}`),
			data(`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":1500,
				"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":0,"audio_tokens":0,
					"cache_creation_token_details":{"ephemeral_1h_input_tokens":0}},
				"completion_tokens_details":{"audio_tokens":0}}}`),
		}, pricing.Usage{Input: 300, CacheRead: 500, CacheWrite: 200, CacheWrite1h: 50, AudioInput: 100, Output: 500, AudioOutput: 250}, true, false},
		{"a trailing report's zeros keep the total", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":300,"total_tokens":1500,
				"prompt_tokens_details":{"cached_tokens":500,"cache_write_tokens":200,"audio_tokens":100,
					"cache_creation_token_details":{"ephemeral_1h_input_tokens":50}},
				"completion_tokens_details":{"audio_tokens":250}}}`),
			data(`{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"prompt_tokens_details":{"cached_tokens":500}}}`),
		}, pricing.Usage{Input: 300, CacheRead: 500, CacheWrite: 200, CacheWrite1h: 50, AudioInput: 100, Output: 500, AudioOutput: 250}, true, false},
		{"usage null and empty usage are not reports", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`),
			data(`{"choices":[],"usage":null}`),
			data(`{"choices":[],"usage":{}}`),
		}, pricing.Usage{Input: 5, Output: 3}, true, false},
		{"cache write from prompt_tokens_details", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":20,"cache_write_tokens":30}}}`),
		}, pricing.Usage{Input: 50, CacheRead: 20, CacheWrite: 30, Output: 3}, true, false},
		// LiteLLM serving Claude breaks the writes down by ttl; a one-hour part is never more
		// than the writes.
		{"one-hour cache writes from prompt_tokens_details.cache_creation_token_details", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":20,"cache_write_tokens":30,
				"cache_creation_token_details":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":20}}}}`),
		}, pricing.Usage{Input: 50, CacheRead: 20, CacheWrite: 30, CacheWrite1h: 20, Output: 3}, true, false},
		{"a one-hour part above the writes counts as them", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cache_write_tokens":30,
				"cache_creation_token_details":{"ephemeral_1h_input_tokens":90}}}}`),
		}, pricing.Usage{Input: 70, CacheWrite: 30, CacheWrite1h: 30, Output: 3}, true, false},
		// gpt-4o-audio-preview's report: the prompt's audio tokens are a part of prompt_tokens.
		{"audio input from prompt_tokens_details", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":600}}}`),
		}, pricing.Usage{Input: 1000, AudioInput: 600, Output: 5}, true, false},
		{"audio input never more than the uncached prompt", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":700,"audio_tokens":600}}}`),
		}, pricing.Usage{Input: 300, CacheRead: 700, AudioInput: 300, Output: 5}, true, false},
		{"a later report without details keeps the audio count", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1,"prompt_tokens_details":{"audio_tokens":600}}}`),
			data(`{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":40}}`),
		}, pricing.Usage{Input: 1000, AudioInput: 600, Output: 40}, true, false},
		// A spoken answer's report: its audio tokens are a part of completion_tokens.
		{"audio output from completion_tokens_details", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":300,"completion_tokens_details":{"audio_tokens":250,"text_tokens":50}}}`),
		}, pricing.Usage{Input: 20, Output: 300, AudioOutput: 250}, true, false},
		{"audio output never more than the output", []Event{
			data(`{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":100,"completion_tokens_details":{"audio_tokens":250}}}`),
		}, pricing.Usage{Input: 20, Output: 100, AudioOutput: 100}, true, false},
		{"first present cached field wins, null details skipped", []Event{
			data(`{"usage":{"prompt_tokens":100,"prompt_tokens_details":null,"prompt_cache_hit_tokens":40,"cached_tokens":7}}`),
		}, pricing.Usage{Input: 60, CacheRead: 40}, true, false},
		{"cache larger than prompt never bills negative input", []Event{
			data(`{"usage":{"prompt_tokens":10,"cached_tokens":40,"completion_tokens":-5}}`),
		}, pricing.Usage{CacheRead: 40}, true, false},
		{"error object mid-stream", []Event{
			data(`{"choices":[{"delta":{"content":"x"}}]}`),
			data(`{"error":{"message":"overloaded"}}`),
		}, pricing.Usage{}, false, true},
		{"error null is no error", []Event{
			data(`{"choices":[],"error":null,"usage":{"prompt_tokens":1}}`),
		}, pricing.Usage{Input: 1}, true, false},
		{"event: error", []Event{{Name: "error", Data: []byte(`not json`)}}, pricing.Usage{}, false, true},
		{"garbage is ignored", []Event{data(`{"usage":{"prompt_tokens":`), data(`}{`), {Raw: []byte(": ping\n\n")}}, pricing.Usage{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := meterEvents(FormatChat, tc.events...)
			if got.Usage != tc.want || got.Reported != tc.rep || got.UpstreamError != tc.err {
				t.Errorf("got %+v, want usage %+v reported=%v upstream_error=%v", got, tc.want, tc.rep, tc.err)
			}
		})
	}
}

func TestMeterOutputChars(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      Format
		events []Event
		want   int64
	}{
		{"chat deltas", FormatChat, []Event{
			data(`{"choices":[{"delta":{"role":"assistant","content":"héllo","reasoning_content":"ab"}}]}`),
			data(`{"choices":[{"delta":{"reasoning":"c","tool_calls":[{"function":{"arguments":"{\"a\":1}"}}]}}]}`),
			data(`{"choices":[{"delta":{"content":null}}],"text":"ignored"}`),
		}, 6 + 2 + 1 + 7},
		{"legacy completions", FormatCompletions, []Event{data(`{"choices":[{"text":"abc"}]}`)}, 3},
		{"anthropic", FormatAnthropic, []Event{
			data(`{"type":"content_block_delta","delta":{"type":"text_delta","text":"abc"}}`),
			data(`{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"de"}}`),
			data(`{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"x"}}`),
			data(`{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"zzzz"}}`),
		}, 3 + 2 + 3},
		{"responses", FormatResponses, []Event{
			data(`{"type":"response.output_text.delta","delta":"abcd"}`),
			data(`{"type":"response.reasoning_summary_text.delta","delta":"e"}`),
			data(`{"type":"response.function_call_arguments.delta","delta":"{}"}`),
		}, 4 + 1 + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := meterEvents(tc.f, tc.events...); got.OutputChars != tc.want || got.Reported {
				t.Errorf("OutputChars %d reported %v, want %d false", got.OutputChars, got.Reported, tc.want)
			}
		})
	}
}

// TestMeterSpokenAnswer: a spoken answer's transcript is text the model wrote, its audio is
// counted by how long it plays (20 tokens a second): a streamed answer's raw PCM by its bytes,
// a whole answer's file by its format's timing.
func TestMeterSpokenAnswer(t *testing.T) {
	second := base64.StdEncoding.EncodeToString(make([]byte, pcmBytesPerSecond))
	half := base64.StdEncoding.EncodeToString(make([]byte, pcmBytesPerSecond/2+1)) // padded
	streamed := meterEvents(FormatChat,
		data(`{"choices":[{"delta":{"role":"assistant","audio":{"id":"a","transcript":"Hel"}}}]}`),
		data(`{"choices":[{"delta":{"audio":{"transcript":"lo"}}}]}`),
		data(`{"choices":[{"delta":{"audio":{"data":"`+second+`"}}}]}`),
		data(`{"choices":[{"delta":{"audio":{"data":"`+half+`"}}}]}`),
		data(`{"choices":[{"delta":{"audio":{"data":null}}}]}`))
	// 1.5 s and 2 bytes: 30 tokens and a part of one.
	if streamed.OutputChars != 5 || streamed.AudioOutput != 31 || streamed.Reported || !streamed.Produced() {
		t.Errorf("streamed: %+v, want 5 transcript bytes and 31 audio tokens, unreported", streamed)
	}
	if out, audio := streamed.EstimatedOutput(); out != EstimateOutputTokens(5)+31 || audio != 31 {
		t.Errorf("streamed estimate: %d output, %d audio, want %d and 31", out, audio, EstimateOutputTokens(5)+31)
	}
	// A whole answer's WAV: 8 kHz 8-bit mono, 3 seconds.
	wav := make([]byte, 44+3*8000)
	copy(wav, "RIFF")
	copy(wav[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint16(wav[22:], 1)
	binary.LittleEndian.PutUint32(wav[24:], 8000)
	binary.LittleEndian.PutUint32(wav[28:], 8000)
	binary.LittleEndian.PutUint16(wav[34:], 8)
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
		base64.StdEncoding.EncodeToString(wav) + `","transcript":"Hi."}}}]}`))
	// 3.0055 s (its header is timed as samples too): 61 tokens, rounded up.
	if whole := m.Result(); whole.OutputChars != 3 || whole.AudioOutput != 61 {
		t.Errorf("whole answer: %+v, want 3 transcript bytes and 61 audio tokens", whole)
	}
	if silent := meterEvents(FormatChat, data(`{"choices":[{"delta":{"content":""}}]}`)); silent.Produced() {
		t.Errorf("an empty delta produced output: %+v", silent)
	}
}

func TestBase64Len(t *testing.T) {
	for n := range 10 {
		if got := base64Len(base64.StdEncoding.EncodeToString(make([]byte, n))); got != int64(n) {
			t.Errorf("base64Len of %d bytes = %d", n, got)
		}
	}
}

// TestMeterKeepsTheResponseID: a Responses answer's id, from its first event or its body, is
// what a continuation names (previous_response_id).
func TestMeterKeepsTheResponseID(t *testing.T) {
	streamed := meterEvents(FormatResponses,
		data(`{"type":"response.created","response":{"id":"resp_1","model":"m"}}`),
		data(`{"type":"response.completed","response":{"id":"resp_other","model":"m","usage":{"input_tokens":3,"output_tokens":4}}}`))
	if streamed.ResponseID != "resp_1" {
		t.Errorf("streamed: response id %q, want resp_1", streamed.ResponseID)
	}
	m := NewMeter(FormatResponses)
	m.Body([]byte(`{"id":"resp_2","object":"response","model":"m","usage":{"input_tokens":3,"output_tokens":4}}`))
	if got := m.Result().ResponseID; got != "resp_2" {
		t.Errorf("body: response id %q, want resp_2", got)
	}
	if chat := meterEvents(FormatChat, data(`{"id":"chatcmpl-1","choices":[]}`)); chat.ResponseID != "" {
		t.Errorf("a chat answer has no response id to continue: %q", chat.ResponseID)
	}
}

func TestMeterAnthropic(t *testing.T) {
	start := data(`{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"cache_creation_input_tokens":3,"output_tokens":1}}}`)
	t.Run("delta replaces only the fields it has", func(t *testing.T) {
		got := meterEvents(FormatAnthropic, start, data(`{"type":"message_delta","usage":{"output_tokens":42}}`))
		if want := (pricing.Usage{Input: 10, CacheRead: 5, CacheWrite: 3, Output: 42}); got.Usage != want || !got.Reported {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
	t.Run("iterations are summed", func(t *testing.T) {
		got := meterEvents(FormatAnthropic, start, data(`{"type":"message_delta","usage":{"input_tokens":7,"output_tokens":2,
			"iterations":[{"input_tokens":1,"output_tokens":2,"cache_read_input_tokens":4},{"input_tokens":7,"output_tokens":2}]}}`))
		if want := (pricing.Usage{Input: 8, CacheRead: 4, CacheWrite: 3, Output: 4}); got.Usage != want {
			t.Errorf("got %+v, want %+v", got.Usage, want)
		}
	})
	t.Run("one-hour cache writes", func(t *testing.T) {
		// cache_creation breaks cache_creation_input_tokens into its five-minute and one-hour
		// parts; a delta that repeats only the total keeps the part.
		start := data(`{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":300,
			"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":200},"output_tokens":1}}}`)
		got := meterEvents(FormatAnthropic, start, data(`{"type":"message_delta","usage":{"cache_creation_input_tokens":300,"output_tokens":42}}`))
		if want := (pricing.Usage{Input: 10, CacheWrite: 300, CacheWrite1h: 200, Output: 42}); got.Usage != want {
			t.Errorf("stream: got %+v, want %+v", got.Usage, want)
		}
		m := NewMeter(FormatAnthropic)
		m.Body([]byte(`{"type":"message","content":[],"usage":{"input_tokens":3,"cache_creation_input_tokens":418,
			"cache_creation":{"ephemeral_5m_input_tokens":18,"ephemeral_1h_input_tokens":400},"output_tokens":4}}`))
		if want := (pricing.Usage{Input: 3, CacheWrite: 418, CacheWrite1h: 400, Output: 4}); m.Result().Usage != want {
			t.Errorf("body: got %+v, want %+v", m.Result().Usage, want)
		}
		it := meterEvents(FormatAnthropic, data(`{"type":"message_delta","usage":{"output_tokens":2,"iterations":[
			{"input_tokens":1,"output_tokens":1,"cache_creation_input_tokens":50,"cache_creation":{"ephemeral_1h_input_tokens":50}},
			{"input_tokens":2,"output_tokens":1,"cache_creation_input_tokens":30,"cache_creation":{"ephemeral_1h_input_tokens":10}}]}}`))
		if want := (pricing.Usage{Input: 3, CacheWrite: 80, CacheWrite1h: 60, Output: 2}); it.Usage != want {
			t.Errorf("iterations: got %+v, want %+v", it.Usage, want)
		}
	})
	t.Run("error event", func(t *testing.T) {
		got := meterEvents(FormatAnthropic, start, Event{Name: "error", Data: []byte(`{"type":"error","error":{"type":"overloaded_error"}}`)})
		if !got.UpstreamError || !got.Reported {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("body", func(t *testing.T) {
		m := NewMeter(FormatAnthropic)
		m.Body([]byte(`{"type":"message","content":[{"type":"text","text":"hi"},{"type":"tool_use","input":{"a":1}}],"usage":{"input_tokens":3,"output_tokens":4}}`))
		got := m.Result()
		if want := (pricing.Usage{Input: 3, Output: 4}); got.Usage != want || got.OutputChars != 2+7 {
			t.Errorf("got %+v", got)
		}
	})
}

func TestMeterResponses(t *testing.T) {
	t.Run("incomplete carries usage", func(t *testing.T) {
		got := meterEvents(FormatResponses, data(`{"type":"response.incomplete","response":{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":16}}}`))
		if want := (pricing.Usage{Input: 5, CacheRead: 4, Output: 16}); got.Usage != want || !got.Reported || got.UpstreamError {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("usage on other events is ignored", func(t *testing.T) {
		got := meterEvents(FormatResponses, data(`{"type":"response.in_progress","response":{"usage":{"input_tokens":9}}}`))
		if got.Reported {
			t.Errorf("got %+v", got)
		}
	})
	t.Run("body", func(t *testing.T) {
		m := NewMeter(FormatResponses)
		m.Body([]byte(`{"object":"response","error":null,"output":[{"type":"message","content":[{"type":"output_text","text":"abc"}]}],"usage":{"input_tokens":2,"output_tokens":3}}`))
		got := m.Result()
		if want := (pricing.Usage{Input: 2, Output: 3}); got.Usage != want || got.OutputChars != 3 || got.UpstreamError {
			t.Errorf("got %+v", got)
		}
	})
}

func TestMeterBodyErrorsAndHugeNumbers(t *testing.T) {
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"error":{"message":"bad"}}`))
	if got := m.Result(); !got.UpstreamError || got.Reported {
		t.Errorf("got %+v", got)
	}
	m = NewMeter(FormatChat)
	m.Body([]byte(`{"usage":{"prompt_tokens":1e300,"completion_tokens":` + strings.Repeat("9", 40) + `,"total_tokens":-1}}`))
	if got := m.Result().Usage; got.Input != pricing.MaxTokens || got.Output != pricing.MaxTokens {
		t.Errorf("got %+v, want both clamped to MaxTokens", got)
	}
}

// An Anthropic stream cut after message_start and many text deltas (the client left, the
// upstream broke) must not be billed message_start's placeholder output_tokens (1) as if it
// were the final count: the output so far is what the deltas carried.
func TestAnthropicStreamCutBeforeMessageDeltaBillsStreamedOutput(t *testing.T) {
	evs := []Event{data(`{"type":"message_start","message":{"usage":{"input_tokens":15,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`)}
	text := strings.Repeat("abcd", 1000) // ~1000 tokens of text
	for i := 0; i < 10; i++ {
		evs = append(evs, data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}`))
	}
	got := meterEvents(FormatAnthropic, evs...)
	if got.Usage.Output < EstimateOutputTokens(got.OutputChars) {
		t.Fatalf("output billed %d tokens after %d bytes of streamed text (estimate %d): message_start's placeholder taken as final",
			got.Usage.Output, got.OutputChars, EstimateOutputTokens(got.OutputChars))
	}
}

// The input estimate (a cancelled or timed-out call without a usage report) counts the
// request's text. Tool results are text of the request, often most of an agent's prompt:
// the Responses API sends them as function_call_output items ("output"), Anthropic as
// tool_result blocks whose content is a string or an array of text blocks.
func TestInputEstimateCountsToolResults(t *testing.T) {
	big := strings.Repeat("x", 40_000) // ~10 000 tokens
	for _, tc := range []struct {
		name string
		f    Format
		body string
	}{
		{"responses function_call_output", FormatResponses,
			`{"model":"m","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"` + big + `"}]}`},
		{"anthropic tool_result string", FormatAnthropic,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"` + big + `"}]}]}`},
		{"anthropic tool_result blocks", FormatAnthropic,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"` + big + `"}]}]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EstimateInputTokens(tc.f, []byte(tc.body)); got < 10_000 {
				t.Errorf("estimate %d tokens for a request with 40 000 bytes of tool output, want ≥ 10 000", got)
			}
		})
	}
}

// Images, audio and files cost the provider's tokens though their bytes say nothing of how
// many (a URL, compressed base64), and tool definitions and output schemas are prompt too: a
// request made of them was estimated at a handful of tokens.
// TestAudioInputEstimate: the audio part of a prompt is estimated apart, so that the output
// bound and a settlement without a usage report price it at the audio price, and a model
// without one refuses it. Found however a provider would read the part: the "type" key in
// any case, its value escaped, or an input_audio payload under another type.
func TestAudioInputEstimate(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Format
		body string
		want int64
	}{
		{"chat text", FormatChat, `{"messages":[{"role":"user","content":"input_audio"}]}`, 0},
		{"chat image", FormatChat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, 0},
		{"chat two clips", FormatChat, `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]},
			{"role":"user","content":[{"type":"text","text":"and"},{"type":"input_audio","input_audio":{"data":"AA","format":"mp3"}}]}]}`, 2 * tokensPerMedia},
		{"type key in another case", FormatChat, `{"messages":[{"role":"user","content":[{"TYPE":"input_audio"}]}]}`, tokensPerMedia},
		{"escaped type", FormatChat, `{"messages":[{"role":"user","content":[{"type":"input\u005faudio"}]}]}`, tokensPerMedia},
		{"content key in another case", FormatChat, `{"messages":[{"role":"user","Content":[{"type":"input_audio"}]}]}`, tokensPerMedia},
		// The type's value is matched exactly, as the provider reads it: a part typed in
		// another case is none it plays.
		{"type value in another case", FormatChat, `{"messages":[{"role":"user","content":[{"type":"INPUT_AUDIO","text":"x"}]}]}`, 0},
		{"payload under another type", FormatChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"x","input_audio":{}}]}]}`, tokensPerMedia},
		{"responses", FormatResponses, `{"input":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA"}}]}]}`, tokensPerMedia},
		{"responses string input", FormatResponses, `{"input":"input_audio"}`, 0},
		// An earlier spoken answer sent back by its id is heard again: audio input of unknown length.
		{"spoken answer sent back", FormatChat, `{"messages":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"user","content":"again"}]}`, tokensPerMedia},
		{"spoken answer sent back, key in another case", FormatChat, `{"messages":[{"role":"assistant","AUDIO":{"id":"audio_1"}}]}`, tokensPerMedia},
		// Only a chat message sends a spoken answer back by its id: a Responses input item has
		// no such field, and an audio object in one is none (an audio estimate refuses the
		// call on a model without an audio price).
		{"responses item with an audio key", FormatResponses, `{"input":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"user","content":"again"}]}`, 0},
		{"a message's audio that is no object", FormatChat, `{"messages":[{"role":"assistant","content":"hi","audio":"audio_1"}]}`, 0},
		{"an echoed message's null audio", FormatChat, `{"messages":[{"role":"assistant","content":"hi","audio":null}]}`, 0},
		{"the word audio in text", FormatChat, `{"messages":[{"role":"user","content":"audio"}]}`, 0},
		{"anthropic has no audio parts", FormatAnthropic, `{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`, 0},
	} {
		if got := EstimateAudioInputTokens(tc.f, []byte(tc.body)); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestInputEstimateCountsMediaAndToolDefinitions(t *testing.T) {
	schema := `{"type":"object","properties":{"q":{"type":"string","description":"` + strings.Repeat("d", 4000) + `"}}}`
	for _, tc := range []struct {
		name string
		f    Format
		body string
		want int64 // at least
	}{
		{"chat images", FormatChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"https://x/a.png"}},{"type":"image_url","image_url":{"url":"https://x/b.png"}}]}]}`,
			2 * tokensPerMedia},
		// A provider decoding with Go's encoding/json reads "Type" as the part's type.
		{"chat image typed in another case", FormatChat,
			`{"model":"m","messages":[{"role":"user","content":[{"Type":"image_url","image_url":{"url":"https://x/a.png"}}]}]}`,
			tokensPerMedia},
		{"chat audio", FormatChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}`,
			tokensPerMedia},
		{"responses image and file", FormatResponses,
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/a.png"},{"type":"input_file","file_id":"f"}]}]}`,
			2 * tokensPerMedia},
		{"anthropic image in a tool result", FormatAnthropic,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"https://x/a.png"}}]}]}]}`,
			tokensPerMedia},
		// An Anthropic document whose source is text (or content blocks) carries its tokens
		// in the body: counted by its bytes, not as one media part (it was 1 600 tokens
		// whatever its length).
		{"anthropic text document", FormatAnthropic,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"` + strings.Repeat("word ", 20_000) + `"}}]}]}`,
			25_000},
		{"anthropic content document", FormatAnthropic,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":"` + strings.Repeat("word ", 20_000) + `"}]}}]}]}`,
			25_000},
		{"chat tool definitions", FormatChat,
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":` + schema + `}}],"messages":[{"role":"user","content":"hi"}]}`,
			1000},
		{"anthropic tool definitions", FormatAnthropic,
			`{"model":"m","tools":[{"name":"f","input_schema":` + schema + `}],"messages":[{"role":"user","content":"hi"}]}`,
			1000},
		{"chat output schema", FormatChat,
			`{"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":` + schema + `}},"messages":[{"role":"user","content":"hi"}]}`,
			1000},
		{"responses output schema", FormatResponses,
			`{"model":"m","text":{"format":{"type":"json_schema","name":"s","schema":` + schema + `}},"input":"hi"}`,
			1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EstimateInputTokens(tc.f, []byte(tc.body)); got < tc.want {
				t.Errorf("estimate %d tokens, want at least %d", got, tc.want)
			}
		})
	}
}

// The model a response names, in each format, is kept (the first one named): a call may be
// billed at its price.
func TestMeterKeepsTheAnsweringModel(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      Format
		events []Event
		body   string
		want   string
	}{
		{"chat stream", FormatChat, []Event{data(`{"model":"gpt-4o-2024-08-06","choices":[]}`), data(`{"model":"other","choices":[]}`)}, "", "gpt-4o-2024-08-06"},
		{"chat body", FormatChat, nil, `{"model":"gpt-4o-2024-08-06","choices":[]}`, "gpt-4o-2024-08-06"},
		{"anthropic stream", FormatAnthropic, []Event{{Name: "message_start", Data: []byte(`{"type":"message_start","message":{"model":"claude-x-20250101","usage":{"input_tokens":1}}}`)}}, "", "claude-x-20250101"},
		{"anthropic body", FormatAnthropic, nil, `{"type":"message","model":"claude-x-20250101","usage":{"input_tokens":1,"output_tokens":2}}`, "claude-x-20250101"},
		{"responses stream", FormatResponses, []Event{{Name: "response.created", Data: []byte(`{"type":"response.created","response":{"model":"o3-2025-04-16"}}`)}}, "", "o3-2025-04-16"},
		{"responses body", FormatResponses, nil, `{"object":"response","model":"o3-2025-04-16","output":[]}`, "o3-2025-04-16"},
		{"not a string", FormatChat, nil, `{"model":7,"choices":[]}`, ""},
		{"too long to be priced", FormatChat, nil, `{"model":"` + strings.Repeat("m", 300) + `"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMeter(tc.f)
			for _, ev := range tc.events {
				m.Event(ev)
			}
			if tc.body != "" {
				m.Body([]byte(tc.body))
			}
			if got := m.Result().Model; got != tc.want {
				t.Errorf("model %q, want %q", got, tc.want)
			}
		})
	}
}

// TestResponsesModelIsTheOneThatCompleted: a Responses stream says at its start which
// model it was asked for (response.created) and at its end which one produced the answer
// (response.completed). A router that picks a model names its pick in the final event; the
// call must be billed at that one.
func TestResponsesModelIsTheOneThatCompleted(t *testing.T) {
	m := NewMeter(FormatResponses)
	for _, ev := range []Event{
		{Name: "response.created", Data: []byte(`{"type":"response.created","response":{"id":"r","model":"router/auto","status":"in_progress"}}`)},
		{Name: "response.output_text.delta", Data: []byte(`{"type":"response.output_text.delta","delta":"hi"}`)},
		{Name: "response.completed", Data: []byte(`{"type":"response.completed","response":{"id":"r","model":"dear-2025-01-01","status":"completed","usage":{"input_tokens":10,"output_tokens":20,"total_tokens":30}}}`)},
	} {
		m.Event(ev)
	}
	if got := m.Result().Model; got != "dear-2025-01-01" {
		t.Errorf("Result().Model = %q, want the model response.completed names", got)
	}
}

// TestResponsesModelIsTheOneThatFailed: a response that fails after output carries what it used
// (response.failed's usage, billed) and names the model that used it, as a completed one does:
// billed at the model response.created named (a router's alias), the failed call was charged
// another model's price than its usage was made at.
func TestResponsesModelIsTheOneThatFailed(t *testing.T) {
	m := NewMeter(FormatResponses)
	for _, ev := range []Event{
		{Name: "response.created", Data: []byte(`{"type":"response.created","response":{"id":"r","model":"router/auto","status":"in_progress"}}`)},
		{Name: "response.output_text.delta", Data: []byte(`{"type":"response.output_text.delta","delta":"hi"}`)},
		{Name: "response.failed", Data: []byte(`{"type":"response.failed","response":{"id":"r","model":"dear-2025-01-01","status":"failed","error":{"code":"server_error","message":"x"},"usage":{"input_tokens":10,"output_tokens":20,"total_tokens":30}}}`)},
	} {
		m.Event(ev)
	}
	if r := m.Result(); r.Model != "dear-2025-01-01" || !r.Reported || !r.UpstreamError {
		t.Errorf("Result() = %+v, want the usage and the model response.failed names", r)
	}
}

// A whole body that starts with a UTF-8 byte order mark is read as the JSON it is, in every
// format.
func TestMeterBodyAfterByteOrderMark(t *testing.T) {
	for f, body := range map[Format]string{
		FormatChat:      `{"usage":{"prompt_tokens":10,"completion_tokens":400}}`,
		FormatAnthropic: `{"type":"message","usage":{"input_tokens":10,"output_tokens":400}}`,
		FormatResponses: `{"object":"response","usage":{"input_tokens":10,"output_tokens":400}}`,
	} {
		m := NewMeter(f)
		m.Body([]byte("\xEF\xBB\xBF" + body + "\n"))
		if r := m.Result(); !r.Reported || r.Usage.Input != 10 || r.Usage.Output != 400 {
			t.Errorf("format %d: %+v, want the reported 10/400", f, r)
		}
	}
}

// Anthropic-compatible servers (SGLang's /v1/messages, among others) put the prompt's count in
// message_start and a 0 in message_delta's input_tokens, meaning "reported before". Counts that
// Anthropic documents as cumulative cannot fall to nothing: the prompt is billed as
// message_start reported it, not at 0. A count that rises replaces, as before.
func TestMeterAnthropicDeltaZeroKeepsThePrompt(t *testing.T) {
	start := data(`{"type":"message_start","message":{"usage":{"input_tokens":1200,"cache_read_input_tokens":500,"cache_creation_input_tokens":300,"output_tokens":1}}}`)
	got := meterEvents(FormatAnthropic, start,
		data(`{"type":"message_delta","usage":{"input_tokens":0,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":42}}`))
	if want := (pricing.Usage{Input: 1200, CacheRead: 500, CacheWrite: 300, Output: 42}); got.Usage != want || !got.Reported || got.Estimated {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// SGLang's earlier releases did the reverse: 0 at the start, the count in the delta.
	got = meterEvents(FormatAnthropic, data(`{"type":"message_start","message":{"usage":{"input_tokens":0,"output_tokens":0}}}`),
		data(`{"type":"message_delta","usage":{"input_tokens":1200,"output_tokens":42}}`))
	if want := (pricing.Usage{Input: 1200, Output: 42}); got.Usage != want {
		t.Errorf("got %+v, want %+v", got.Usage, want)
	}
}

// The rest of what a prompt is made of counts too, each as the estimate's rule says (four
// bytes a token, four tokens a message): a cancelled call is charged this estimate, and a part
// left out is prompt the provider billed that the caller is not charged. An Anthropic system
// prompt and the arguments of an earlier tool call are often most of an agent's prompt; a
// prompt of token ids is one token an id, whatever its digits.
func TestInputEstimateCountsEveryPartOfThePrompt(t *testing.T) {
	text := strings.Repeat("x", 4000) // 1 000 tokens
	ids := strings.TrimSuffix(strings.Repeat("7,", 1000), ",")
	for _, tc := range []struct {
		name string
		f    Format
		body string
		want int64 // at least
	}{
		{"anthropic system prompt", FormatAnthropic,
			`{"model":"m","system":"` + text + `","messages":[{"role":"user","content":"hi"}]}`, 1000},
		{"anthropic system blocks", FormatAnthropic,
			`{"model":"m","system":[{"type":"text","text":"` + text + `"}],"messages":[{"role":"user","content":"hi"}]}`, 1000},
		{"anthropic tool_use input", FormatAnthropic,
			`{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"q":"` + text + `"}}]}]}`, 1000},
		{"completions token ids", FormatCompletions, `{"model":"m","prompt":[` + ids + `]}`, 1000},
		{"completions batch of token ids", FormatCompletions, `{"model":"m","prompt":[[` + ids + `]]}`, 1000},
		// Three messages of one token each: 3 + 3 × 4.
		{"each message's overhead", FormatChat,
			`{"model":"m","messages":[{"role":"user","content":"abcd"},{"role":"assistant","content":"abcd"},{"role":"user","content":"abcd"}]}`, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EstimateInputTokens(tc.f, []byte(tc.body)); got < tc.want {
				t.Errorf("estimate %d tokens, want at least %d", got, tc.want)
			}
		})
	}
}

// A continuation's own parts that its answer does not carry on are its instructions, tool
// definitions and output schema: each is counted, so that the carried context is not reckoned
// larger by what the request sends again.
func TestEstimateNotHandedOnCountsEachOwnPart(t *testing.T) {
	schema := `{"type":"object","properties":{"q":{"type":"string","description":"` + strings.Repeat("d", 4000) + `"}}}`
	for name, body := range map[string]string{
		"instructions":  `{"previous_response_id":"resp_1","instructions":"` + strings.Repeat("x", 4000) + `","input":"hi"}`,
		"tools":         `{"previous_response_id":"resp_1","tools":[{"type":"function","name":"f","parameters":` + schema + `}],"input":"hi"}`,
		"output schema": `{"previous_response_id":"resp_1","text":{"format":{"type":"json_schema","name":"s","schema":` + schema + `}},"input":"hi"}`,
	} {
		if got := EstimateNotHandedOn([]byte(body)); got < 1000 {
			t.Errorf("%s: %d tokens not handed on, want at least 1000", name, got)
		}
	}
	// Instructions are a message of the request's own estimate, overhead included: as much is
	// not handed on (else each estimated link of a chain handed its successor 4 tokens more).
	body := []byte(`{"previous_response_id":"resp_1","instructions":"be brief","input":"cap test"}`)
	own, _ := EstimatePrompt(FormatResponses, body)
	if got, want := EstimateNotHandedOn(body), own-6; got != want {
		t.Errorf("instructions of 8 bytes: %d tokens not handed on, want %d (the request's %d less its input's 6)", got, want, own)
	}
}

// Groq puts a stream's usage in x_groq.usage, whether or not include_usage was asked for: a
// stream whose only report is there is charged by it, not estimated.
func TestMeterReadsGroqUsage(t *testing.T) {
	got := meterEvents(FormatChat,
		data(`{"id":"c","choices":[{"index":0,"delta":{"content":"hello"}}]}`),
		data(`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"x_groq":{"id":"req_1","usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150}}}`),
		data(`[DONE]`))
	if want := (pricing.Usage{Input: 120, Output: 30}); got.Usage != want || !got.Reported {
		t.Errorf("got %+v, want usage %+v reported", got, want)
	}
}

// A negative count in a report is nothing, never a credit against another figure: a cached
// or written count of -50 must not add 50 tokens to the uncached prompt billed at full price.
func TestMeterNegativeCountsAreNothing(t *testing.T) {
	got := meterEvents(FormatChat,
		data(`{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":-50,"cache_write_tokens":-20}}}`))
	if want := (pricing.Usage{Input: 100, Output: 5}); got.Usage != want {
		t.Errorf("got %+v, want %+v", got.Usage, want)
	}
}

// An Anthropic message_delta ends a message's output count: its output_tokens replaces
// message_start's placeholder even when it is 0, and with iterations[] (compaction, server
// tools) the sum over them is final though the delta has no top-level output_tokens. Either
// way the streamed text's estimate does not stand in for it, nor is the usage marked estimated.
func TestMeterAnthropicDeltaOutputIsFinal(t *testing.T) {
	start := data(`{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`)
	got := meterEvents(FormatAnthropic, start, data(`{"type":"message_delta","usage":{"output_tokens":0}}`))
	if want := (pricing.Usage{Input: 10}); got.Usage != want || got.Estimated {
		t.Errorf("final output 0: got %+v, want %+v", got, want)
	}
	text := data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + strings.Repeat("abcd", 100) + `"}}`)
	got = meterEvents(FormatAnthropic, start, text, data(`{"type":"message_delta","usage":{"iterations":[
		{"input_tokens":10,"output_tokens":20},{"input_tokens":4,"output_tokens":30}]}}`))
	if want := (pricing.Usage{Input: 14, Output: 50}); got.Usage != want || got.Estimated {
		t.Errorf("iterations only: got %+v, want %+v, not estimated", got, want)
	}
}

// An embeddings answer has no output: every token it reports is its input. Voyage AI answers
// /v1/embeddings with usage {"total_tokens": n} alone; read as a chat report, the n tokens were
// billed as output, at the output price an embedding model is configured with (0), so each
// call was charged nothing. A report with prompt_tokens still bills those.
func TestMeterEmbeddingsTotalOnlyIsInput(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       pricing.Usage
	}{
		{"total alone (Voyage)", `{"object":"list","data":[{"object":"embedding","embedding":[0.1],"index":0}],"model":"voyage-3","usage":{"total_tokens":10}}`,
			pricing.Usage{Input: 10}},
		{"prompt and total (OpenAI)", `{"object":"list","data":[],"usage":{"prompt_tokens":2,"total_tokens":2}}`, pricing.Usage{Input: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMeter(FormatEmbeddings)
			m.Body([]byte(tc.body))
			if got := m.Result(); got.Usage != tc.want || !got.Reported {
				t.Errorf("got %+v reported=%v, want %+v reported", got.Usage, got.Reported, tc.want)
			}
			price := pricing.Price{Input: 120_000} // an embedding model: output unpriced
			if got, want := price.Cost(m.Result().Usage), price.Cost(tc.want); got != want {
				t.Errorf("charged %d micro-USD, want %d", got, want)
			}
		})
	}
}

// Moonshot (Kimi) reports a stream's usage inside its last choice (choices[0].usage, on the
// finish_reason chunk), and only there unless include_usage is honoured; with it, a top-level
// usage-only chunk follows, whose figures are the final word. The stream below is the shape
// recorded from api.moonshot.ai (vercel/ai, moonshotai-stream-choice-usage): unread, the call
// was charged its prompt's estimate as if the provider had said nothing.
func TestMeterReadsUsageInAChoice(t *testing.T) {
	finish := data(`{"id":"chatcmpl-6a8d","object":"chat.completion.chunk","model":"kimi-k2.5","choices":[{"index":0,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"completion_tokens_details":{"reasoning_tokens":1}}}]}`)
	content := data(`{"id":"chatcmpl-6a8d","object":"chat.completion.chunk","model":"kimi-k2.5","choices":[{"index":0,"delta":{"content":"OK."},"finish_reason":null}]}`)
	got := meterEvents(FormatChat, content, finish, data(`[DONE]`))
	if want := (pricing.Usage{Input: 12, Output: 5}); got.Usage != want || !got.Reported || got.OutputChars != 3 {
		t.Errorf("usage in the choice: got %+v, want usage %+v reported, 3 bytes of output", got, want)
	}
	got = meterEvents(FormatChat, content, finish,
		data(`{"id":"chatcmpl-6a8d","object":"chat.completion.chunk","model":"kimi-k2.5","choices":[],"usage":{"prompt_tokens":99,"completion_tokens":33,"total_tokens":132}}`),
		data(`[DONE]`))
	if want := (pricing.Usage{Input: 99, Output: 33}); got.Usage != want {
		t.Errorf("a later top-level report: got %+v, want %+v", got.Usage, want)
	}
	got = meterEvents(FormatChat, data(`{"choices":[{"index":0,"delta":{},"usage":{"prompt_tokens":1,"completion_tokens":1}}],"usage":{"prompt_tokens":40,"completion_tokens":7}}`))
	if want := (pricing.Usage{Input: 40, Output: 7}); got.Usage != want {
		t.Errorf("top-level beside a choice's: got %+v, want the top-level %+v", got.Usage, want)
	}
}

// An Anthropic stream cut before its message_delta has no final output count: message_start's
// output_tokens is a placeholder, whatever the text streamed after it. The usage is marked
// estimated however little text came (none: a caller that left during a long first token), as
// the row's estimated flag tells a billing team the output is not the provider's count.
func TestAnthropicStreamCutBeforeMessageDeltaIsEstimated(t *testing.T) {
	start := data(`{"type":"message_start","message":{"model":"claude-test","usage":{"input_tokens":2000,"output_tokens":1}}}`)
	for _, tc := range []struct {
		name string
		evs  []Event
	}{
		{"no text", []Event{start}},
		{"less text than the placeholder", []Event{start, data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := meterEvents(FormatAnthropic, tc.evs...)
			if !got.Reported || got.Usage.Input != 2000 || !got.Estimated {
				t.Errorf("got %+v, want the prompt reported (2000) and the usage marked estimated", got)
			}
		})
	}
}

// A report without prompt_tokens (some compatible servers give completion_tokens and
// total_tokens alone) billed the prompt at 0 and the whole total as output, at the output
// price. The prompt is the total less the completion; with no total either, the report says
// nothing of the prompt, and the result says so for the settlement to bill its estimate.
func TestMeterReportWithoutThePrompt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		events  []Event
		want    pricing.Usage
		missing bool
	}{
		{"completion and total", []Event{data(`{"choices":[],"usage":{"completion_tokens":30,"total_tokens":1030}}`)},
			pricing.Usage{Input: 1000, Output: 30}, false},
		{"total below the completion", []Event{data(`{"choices":[],"usage":{"completion_tokens":30,"total_tokens":20}}`)},
			pricing.Usage{Output: 30}, false},
		{"completion alone", []Event{data(`{"choices":[],"usage":{"completion_tokens":30}}`)},
			pricing.Usage{Output: 30}, true},
		{"an earlier report's prompt", []Event{data(`{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}`),
			data(`{"choices":[],"usage":{"completion_tokens":30}}`)}, pricing.Usage{Input: 7, Output: 30}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := meterEvents(FormatChat, tc.events...)
			if got.Usage != tc.want || !got.Reported || got.PromptMissing != tc.missing {
				t.Errorf("got %+v, want usage %+v reported, prompt missing %v", got, tc.want, tc.missing)
			}
		})
	}
}

// TestMeterLiteLLMCacheWrites: LiteLLM serving Claude on the chat route reports its cache
// writes under Anthropic's and its own names, not under OpenAI's cache_write_tokens, which it
// has added only lately: its versions since prompt caching (August 2024) give the top-level
// cache_creation_input_tokens alone, later ones prompt_tokens_details.cache_creation_tokens
// too, and prompt_tokens counts the writes. Read as plain input, the writes were billed at the
// input price, not the cache-write one (1.25× or 2× it), and their one-hour part not at all.
// A report giving several of the names gives the one count under each: it is counted once.
func TestMeterLiteLLMCacheWrites(t *testing.T) {
	for _, tc := range []struct {
		name  string
		body  string
		want  pricing.Usage
		split bool
	}{
		{"top-level cache_creation_input_tokens alone (LiteLLM before prompt_tokens_details.cache_creation_tokens)",
			`{"id":"chatcmpl-1","object":"chat.completion","model":"claude-3-7-sonnet-20250219","choices":[{"index":0,"finish_reason":"stop",
			"message":{"role":"assistant","content":"Python is versatile."}}],"usage":{"completion_tokens":20,"prompt_tokens":1000,
			"total_tokens":1020,"completion_tokens_details":null,"prompt_tokens_details":{"audio_tokens":null,"cached_tokens":100},
			"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}`,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, Output: 20}, false},
		{"prompt_tokens_details.cache_creation_tokens with its ttl breakdown",
			`{"id":"chatcmpl-2","object":"chat.completion","model":"claude-sonnet-4-6","choices":[{"index":0,"finish_reason":"stop",
			"message":{"role":"assistant","content":"Python is versatile."}}],"usage":{"completion_tokens":20,"prompt_tokens":1000,
			"total_tokens":1020,"prompt_tokens_details":{"cached_tokens":100,"text_tokens":300,"cache_creation_tokens":600,
			"cache_creation_token_details":{"ephemeral_5m_input_tokens":200,"ephemeral_1h_input_tokens":400}},
			"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}`,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 400, Output: 20}, true},
		{"every name at once is one count",
			`{"choices":[],"usage":{"completion_tokens":20,"prompt_tokens":1000,"total_tokens":1020,
			"prompt_tokens_details":{"cached_tokens":100,"cache_write_tokens":600,"cache_creation_tokens":600},
			"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}`,
			pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, Output: 20}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMeter(FormatChat)
			m.Body([]byte(tc.body))
			if got := m.Result(); got.Usage != tc.want || !got.Reported || got.CacheWriteSplit != tc.split {
				t.Errorf("got %+v, want usage %+v reported, split %v", got, tc.want, tc.split)
			}
			// The same report as a stream's last chunk.
			chunk := strings.Replace(tc.body, `"choices":[{`, `"choices":[],"x":[{`, 1)
			if got := meterEvents(FormatChat, data(chunk), data(`[DONE]`)); got.Usage != tc.want {
				t.Errorf("streamed: got %+v, want %+v", got.Usage, tc.want)
			}
		})
	}
}
