package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/metering"
)

// TestLastUsageFindsTheReportAtTheEnd: the usage of an answer too large to relay is read from
// its end, in a whole body or an event stream, never from text that quotes the word, nor from
// the word as a value followed by an object (an array's element in a tool's input): taken for a
// key there, an answer with no report of its own was billed the figures its content held.
func TestLastUsageFindsTheReportAtTheEnd(t *testing.T) {
	for _, tc := range []struct{ name, tail, want string }{
		{"body", `...ing"}}],"usage":{"prompt_tokens":3,"completion_tokens":9},"service_tier":"default"}`, `{"prompt_tokens":3,"completion_tokens":9}`},
		{"spaces", `"usage" : {"prompt_tokens":3} }`, `{"prompt_tokens":3}`},
		{"event stream", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n", `{"prompt_tokens":3}`},
		{"quoted in text only", `"transcript":"the \"usage\":{\"prompt_tokens\":1} field"}}]}`, ``},
		{"a value, not a key", `"input":{"fields":["usage",{"prompt_tokens":1000000}]}}]}`, ``},
		{"null", `"usage":null}`, ``},
		{"cut inside", `"usage":{"prompt_tokens":3,"compl`, ``},
		{"none", `{"choices":[]}`, ``},
	} {
		if got := lastUsage([]byte(tc.tail)); got.Raw != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got.Raw, tc.want)
		}
	}
}

// TestMeterOversizedReadsAtMostItsBound: an answer that never ends is read up to the bound and
// no further.
func TestMeterOversizedReadsAtMostItsBound(t *testing.T) {
	endless := strings.NewReader(strings.Repeat("x", 10<<20))
	m := metering.NewMeter(metering.FormatChat)
	if read := meterOversized(m, []byte(`{"model":"m"`), endless, 1<<20); read != 1<<20 {
		t.Fatalf("read %d bytes, want the bound, %d", read, 1<<20)
	}
	if m.Result().Reported {
		t.Fatal("a usage was found in bytes that hold none")
	}
	m = metering.NewMeter(metering.FormatChat)
	rest := strings.Repeat("y", 600<<10) + `"}}],"usage":{"prompt_tokens":3,"completion_tokens":9}}`
	meterOversized(m, []byte(`{"id":"x","model":"gpt-4o","choices":[{"message":{"content":"`), strings.NewReader(rest), 4<<20)
	if r := m.Result(); !r.Reported || r.Usage.Input != 3 || r.Usage.Output != 9 || r.Model != "gpt-4o" {
		t.Fatalf("result %+v, want the usage at the end and the model at the head", r)
	}
}

// TestMeterOversizedFindsAnEmbeddingsListsModelAtItsEnd: an embeddings list, the largest
// answers there are, names its model after its data, beside its usage: read from the head
// alone, the model that answered was lost, and the call billed at the price of the one asked
// for (a router's fallback, an alias, priced under another name).
func TestMeterOversizedFindsAnEmbeddingsListsModelAtItsEnd(t *testing.T) {
	head := []byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":"`)
	rest := strings.Repeat("A", 600<<10) + `"}],"model":"text-embedding-3-large","usage":{"prompt_tokens":8000,"total_tokens":8000}}`
	m := metering.NewMeter(metering.FormatEmbeddings)
	meterOversized(m, head, strings.NewReader(rest), 4<<20)
	if r := m.Result(); !r.Reported || r.Usage.Input != 8000 || r.Model != "text-embedding-3-large" {
		t.Fatalf("result %+v, want the usage and the model at the end", r)
	}
}

// TestAnswerOfAnyLengthIsReadWithinItsCount: a Content-Length past max_response_bytes, up to
// the largest Go reads (2⁶³−1), sizes no buffer past the limit (sized from it plus one, it
// overflowed, and make panicked), and no buffer counts more than the limit.
func TestAnswerOfAnyLengthIsReadWithinItsCount(t *testing.T) {
	const limit = 4 << 10
	for _, hint := range []int64{-1, 0, 10, limit - 1, limit, limit + 1, math.MaxInt64} {
		m := newAnswerMemory(limit, limit, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}))
		b := m.buffer(1)
		body, err := b.readAll(context.Background(), strings.NewReader(strings.Repeat("x", 10)), hint, limit)
		if err != nil || string(body) != strings.Repeat("x", 10) || b.n > limit {
			t.Errorf("Content-Length %d: %q, %v, counted %d; want the 10 bytes, at most %d counted", hint, body, err, b.n, limit)
		}
		b.release()
	}
}

// TestMeterOversizedTrustsOnlyAWholeAnswer: the usage report of an answer too large to relay
// comes last; an answer cut before its end (the upstream broke, the caller left and the
// upstream call with it, or the read bound) has none of its own. A "usage" object in what was
// read is then part of the answer: an Anthropic tool_use input is raw JSON shaped by the
// caller's schema, and was taken for the report, charging the call 1 token in and 1 out
// instead of its prompt's estimate.
func TestMeterOversizedTrustsOnlyAWholeAnswer(t *testing.T) {
	head := []byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"tool_use","id":"t","name":"f","input":{"pad":"`)
	rest := strings.Repeat("y", 300<<10) + `","usage":{"input_tokens":1,"output_tokens":1}}},{"type":"text","text":"` + strings.Repeat("z", 100<<10)
	m := metering.NewMeter(metering.FormatAnthropic)
	meterOversized(m, head, io.MultiReader(strings.NewReader(rest), errReader{errors.New("connection reset")}), 4<<20)
	if r := m.Result(); r.Reported {
		t.Fatalf("a cut answer metered by the usage inside its tool input: %+v", r.Usage)
	}
	m = metering.NewMeter(metering.FormatAnthropic)
	meterOversized(m, head, strings.NewReader(rest), int64(len(rest))-10) // past the read bound
	if r := m.Result(); r.Reported {
		t.Fatalf("an answer read up to its bound metered by the usage inside its tool input: %+v", r.Usage)
	}
	// An answer whose end is exactly the read bound is whole: its report counts.
	whole := rest + `"}],"stop_reason":"end_turn","usage":{"input_tokens":70,"output_tokens":9000}}`
	m = metering.NewMeter(metering.FormatAnthropic)
	meterOversized(m, head, strings.NewReader(whole), int64(len(whole)))
	if r := m.Result(); !r.Reported || r.Usage.Input != 70 || r.Usage.Output != 9000 {
		t.Fatalf("an answer ending at the read bound: %+v, want its report (70 in, 9 000 out)", r)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// BenchmarkLastUsageManyWords: a tail of occurrences of "usage" that are not a report (token
// values of logprobs, an array of the word in raw JSON) is searched in one pass. Each
// occurrence was parsed from a copy of the rest of the tail: 8 s of CPU on 512 KiB.
func BenchmarkLastUsageManyWords(b *testing.B) {
	tail := []byte(`{"x":[` + strings.Repeat(`"usage",`, (512<<10)/8) + `1]`)
	b.SetBytes(int64(len(tail)))
	for b.Loop() {
		if r := lastUsage(tail); r.Exists() {
			b.Fatalf("found %q", r.Raw)
		}
	}
}

// FuzzMeterOversized: an answer too large to relay is billed as the same answer relayed whole.
// For any whole JSON body in any format, read from any head (the bytes read before it was
// found too large) and the rest, meterOversized meters the usage and the answering model
// meterBody reads of the body whole, when its one top-level usage object is the last object
// under a "usage" key in its text (what meterOversized reads: its report comes last). A
// spoken answer's audio aside: its length is not read from an answer that is not kept.
func FuzzMeterOversized(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","model":"gpt-4o","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"object":"list","data":[{"embedding":"AAAA"}],"model":"text-embedding-3-large","usage":{"prompt_tokens":8,"total_tokens":8}}`,
		`{"id":"msg","type":"message","model":"claude-test","content":[{"type":"tool_use","input":{"usage":{"input_tokens":1}}}],"usage":{"input_tokens":70,"cache_creation":{"ephemeral_1h_input_tokens":5},"output_tokens":9}}`,
		`{"id":"resp","object":"response","model":"gpt-5","output":[{"content":[{"text":"t"}]}],"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":9}}`,
		// llama.cpp's server's answer of two tasks: the first task's usage and timings alone;
		// and such an answer whose choices are not all objects, or come under two keys.
		`{"choices":[{"text":"aa","index":0,"message":{"content":"aa"}},{"text":"bbbbbbbb","index":1,"message":{"content":"bbbbbbbb"}}],"model":"m","usage":{"completion_tokens":1,"prompt_tokens":4,"total_tokens":5},"id":"c","timings":{"prompt_n":4,"predicted_n":1}}`,
		`{"choices":[1,{"text":"bbbbbbbb","message":{"content":"bbbbbbbb"}},"x",{"text":"cccc","message":{"content":"cccc"}}],"usage":{"completion_tokens":1,"prompt_tokens":4},"timings":{"predicted_n":1}}`,
		`{"choices":[{"text":"aaaa","message":{"content":"aaaa"}}],"choices":[{"text":"bbbbbbbb","message":{"content":"bbbbbbbb"}}],"usage":{"completion_tokens":1,"prompt_tokens":4},"timings":{"predicted_n":1}}`,
	} {
		for format := range uint8(5) {
			f.Add([]byte(s), uint16(len(s)/2), format)
		}
	}
	formats := [...]metering.Format{metering.FormatChat, metering.FormatCompletions, metering.FormatResponses, metering.FormatEmbeddings, metering.FormatAnthropic}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, format uint8) {
		if !wholeJSON(body) {
			return
		}
		var usages []gjson.Result
		gjson.ParseBytes(metering.TrimBody(body)).ForEach(func(k, v gjson.Result) bool {
			if k.Str == "usage" {
				usages = append(usages, v)
			}
			return true
		})
		if len(usages) != 1 || !usages[0].IsObject() || lastUsage(body).Raw != usages[0].Raw {
			return
		}
		fm := formats[int(format)%len(formats)]
		whole := metering.NewMeter(fm)
		meterBody(whole, body)
		head := body[:int(cut)%(len(body)+1)]
		over := metering.NewMeter(fm)
		meterOversized(over, bytes.Clone(head), bytes.NewReader(body[len(head):]), math.MaxInt64)
		want, got := whole.Result(), over.Result()
		if want.AudioOutput > 0 {
			return
		}
		if got.Usage != want.Usage || got.Reported != want.Reported || got.PromptMissing != want.PromptMissing ||
			got.Estimated != want.Estimated || got.Model != want.Model {
			t.Fatalf("too large: %+v reported %v model %q\nwhole: %+v reported %v model %q", got.Usage, got.Reported, got.Model,
				want.Usage, want.Reported, want.Model)
		}
	})
}
