package metering

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// TestMeterAnthropicSecondDeltaOfZerosKeepsTheFinalOutput: a proxy that appends a second
// message_delta of zeros after the provider's real one must not take back the final output
// count: the answer was billed at 0 output. Mutant: the output's 0 replaces any count.
func TestMeterAnthropicSecondDeltaOfZerosKeepsTheFinalOutput(t *testing.T) {
	start := data(`{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`)
	got := meterEvents(FormatAnthropic, start,
		data(`{"type":"message_delta","usage":{"output_tokens":50}}`),
		data(`{"type":"message_delta","usage":{"input_tokens":0,"output_tokens":0}}`))
	if want := (pricing.Usage{Input: 10, Output: 50}); got.Usage != want || got.Estimated {
		t.Errorf("a final count then a delta of zeros: got %+v, want %+v, not estimated", got, want)
	}
}

// TestScannerUnterminatedEventOneByteOverTheLimitIsRefused: an event cut by the stream's end
// one byte past maxEvent is refused as too large, as a terminated one is; the scanner never
// hands on more than maxEvent bytes of one event. Mutant: the incomplete event's bound off by
// one.
func TestScannerUnterminatedEventOneByteOverTheLimitIsRefused(t *testing.T) {
	const max = 64
	for _, n := range []int{max, max + 1} {
		raw := "data: " + strings.Repeat("x", n-len("data: "))
		sc := NewScanner(strings.NewReader(raw), max)
		ev, err := sc.Next()
		switch {
		case n <= max && (err != nil || string(ev.Raw) != raw || !ev.Unterminated):
			t.Errorf("%d bytes, limit %d: %q unterminated %v, err %v; want the event whole, unterminated", n, max, ev.Raw, ev.Unterminated, err)
		case n > max && !errors.Is(err, ErrEventTooLarge):
			t.Errorf("%d bytes, limit %d: %d bytes handed on, err %v; want ErrEventTooLarge", n, max, len(ev.Raw), err)
		}
	}
}

// emptyReader returns (0, nil) on every read and counts them.
type emptyReader struct{ reads int }

func (r *emptyReader) Read([]byte) (int, error) {
	r.reads++
	return 0, nil
}

// TestScannerGivesUpAfterMaxEmptyReads: a reader that returns nothing and no error is
// declared stuck after exactly maxEmptyReads reads, io.ErrNoProgress, as io.Reader's
// contract lets a caller. Mutant: the bound off by one.
func TestScannerGivesUpAfterMaxEmptyReads(t *testing.T) {
	r := &emptyReader{}
	if _, err := NewScanner(r, 0).Next(); !errors.Is(err, io.ErrNoProgress) || r.reads != maxEmptyReads {
		t.Errorf("err %v after %d reads, want io.ErrNoProgress after %d", err, r.reads, maxEmptyReads)
	}
}

// TestMeterKeepsAModelNameUpToItsBound: a model name of maxModelName bytes is kept, one byte
// longer is none (no price could match it). Mutant: the bound off by one.
func TestMeterKeepsAModelNameUpToItsBound(t *testing.T) {
	for _, n := range []int{maxModelName, maxModelName + 1} {
		name := strings.Repeat("m", n)
		got := meterEvents(FormatChat, data(`{"model":"`+name+`","choices":[]}`)).Model
		if want := name; n > maxModelName {
			want = ""
			if got != want {
				t.Errorf("a model name of %d bytes: kept %d bytes, want none", n, len(got))
			}
		} else if got != want {
			t.Errorf("a model name of %d bytes: kept %q, want it whole", n, got)
		}
	}
}

// TestMeterAnthropicStartOfZerosIsNoReport: a shim's message_start placeholder of zeros, in a
// stream cut before its message_delta, is no report: the prompt is estimated (Reported false),
// not charged at 0. Mutant: message_start's usage taken whatever it counts.
func TestMeterAnthropicStartOfZerosIsNoReport(t *testing.T) {
	got := meterEvents(FormatAnthropic,
		data(`{"type":"message_start","message":{"usage":{"input_tokens":0,"output_tokens":0}}}`),
		data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello there"}}`))
	if got.Reported || got.OutputChars != int64(len("hello there")) {
		t.Errorf("message_start of zeros, cut before message_delta: reported %v, %d output chars; want no report, 11 chars", got.Reported, got.OutputChars)
	}
}

// TestMeterAnthropicIterationsGiveThePrompt: a message_delta whose usage counts the prompt in
// its iterations alone (a shim whose message_start carries no usage) says what the prompt was:
// it is billed, not replaced by its estimate (PromptMissing). Mutant: only a top-level
// input_tokens counts as the prompt given.
func TestMeterAnthropicIterationsGiveThePrompt(t *testing.T) {
	got := meterEvents(FormatAnthropic,
		data(`{"type":"message_start","message":{"model":"claude-test"}}`),
		data(`{"type":"message_delta","usage":{"iterations":[{"input_tokens":10,"output_tokens":20},{"input_tokens":4,"output_tokens":30}]}}`))
	if want := (pricing.Usage{Input: 14, Output: 50}); got.Usage != want || got.PromptMissing || !got.Reported {
		t.Errorf("iterations alone: got %+v, want %+v reported, the prompt not missing", got, want)
	}
}

// TestMeterResponsesOneHourCacheWrites: a Responses usage that breaks its cache writes down by
// ttl (LiteLLM serving Claude) under input_tokens_details gives the one-hour part, as the chat
// shape's prompt_tokens_details does. Mutant: the Responses name of the figure dropped.
func TestMeterResponsesOneHourCacheWrites(t *testing.T) {
	m := NewMeter(FormatResponses)
	m.Body([]byte(`{"id":"resp_1","object":"response","model":"claude-test","output":[],"usage":{"input_tokens":100,
		"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":40,"cache_creation_token_details":{"ephemeral_1h_input_tokens":30}},
		"output_tokens":5,"total_tokens":105}}`))
	got := m.Result()
	if got.Usage.CacheWrite != 40 || got.Usage.CacheWrite1h != 30 || !got.CacheWriteSplit || got.Usage.Input != 60 {
		t.Errorf("Responses writes split by ttl: got %+v split %v, want 40 written, 30 of them for 1h, 60 input", got.Usage, got.CacheWriteSplit)
	}
}

// TestMeterEmptyErrorStringIsNoError: "error": "" beside a healthy answer is no error (as
// null is not): the answer is not marked as an upstream error. Mutant: any string an error.
func TestMeterEmptyErrorStringIsNoError(t *testing.T) {
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"error":"","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	if got := m.Result(); got.UpstreamError {
		t.Errorf(`"error":"" beside an answer: marked an upstream error`)
	}
}

// TestMeterResponsesAudioOutput: a Responses usage names the spoken part of its output
// output_tokens_details.audio_tokens, billed at the audio price. Mutant: only the chat name
// (completion_tokens_details) read.
func TestMeterResponsesAudioOutput(t *testing.T) {
	m := NewMeter(FormatResponses)
	m.Body([]byte(`{"id":"resp_1","output":[],"usage":{"input_tokens":10,"output_tokens":50,"output_tokens_details":{"audio_tokens":20}}}`))
	if got := m.Result(); got.Usage.AudioOutput != 20 || got.Usage.Output != 50 || got.Estimated {
		t.Errorf("Responses audio output: got %+v estimated %v, want 20 of 50 output as audio, from the report", got.Usage, got.Estimated)
	}
}

// TestMeterAnthropicStreamWithoutUsageIsNotStartOnly: an Anthropic-shaped stream that never
// carried a usage is no report at all: its output is estimated by the settlement, and it is not
// marked StartOnly (a report of the prompt alone) or Estimated. Mutant: the StartOnly rule
// applied without a report.
func TestMeterAnthropicStreamWithoutUsageIsNotStartOnly(t *testing.T) {
	got := meterEvents(FormatAnthropic,
		data(`{"type":"message_start","message":{"model":"claude-test"}}`),
		data(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+strings.Repeat("abcd", 50)+`"}}`))
	if got.Reported || got.StartOnly || got.Estimated || got.Usage != (pricing.Usage{}) {
		t.Errorf("no usage at all: got %+v, want no report, not StartOnly, no usage", got)
	}
}

// TestMeterAnthropicTopLevelCountBesideZeroIterations: a usage whose iterations count nothing
// (a step whose input is 0) but whose top level counts the output is a report: the final
// output is billed. Mutant: the iterations alone decide whether the usage counts nothing.
func TestMeterAnthropicTopLevelCountBesideZeroIterations(t *testing.T) {
	got := meterEvents(FormatAnthropic,
		data(`{"type":"message_start","message":{"model":"claude-test"}}`),
		data(`{"type":"message_delta","usage":{"output_tokens":50,"iterations":[{"input_tokens":0}]}}`))
	if !got.Reported || got.Usage.Output != 50 || got.Estimated {
		t.Errorf("top-level output beside iterations of zeros: got %+v, want a report of 50 output", got)
	}
}

// TestMeterAnthropicBodyOfZerosIsNoReport: a whole Anthropic-shaped answer whose usage is all
// zeros (a shim that counts nothing) is no report: the answer is estimated, not charged 0.
// Mutant: a whole body's usage taken whatever it counts.
func TestMeterAnthropicBodyOfZerosIsNoReport(t *testing.T) {
	m := NewMeter(FormatAnthropic)
	m.Body([]byte(`{"type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"hello there"}],
		"usage":{"input_tokens":0,"output_tokens":0}}`))
	if got := m.Result(); got.Reported || got.OutputChars != int64(len("hello there")) {
		t.Errorf("a body whose usage is zeros: reported %v, %d output chars; want no report, 11 chars", got.Reported, got.OutputChars)
	}
}
