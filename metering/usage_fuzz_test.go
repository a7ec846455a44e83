package metering

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/fixtures"
	"github.com/tollgate/tollgate/pricing"
)

// maxSeedBytes keeps each recorded response seeded into the fuzzers small, so that the seed
// corpus, which every plain `go test` runs, stays fast: a longer one keeps its first and last
// events (the model's name comes first, the usage report last).
const maxSeedBytes = 6 << 10

// fuzzFormats maps a fuzzer's format byte onto a Format.
var fuzzFormats = [...]Format{FormatChat, FormatCompletions, FormatResponses, FormatEmbeddings, FormatAnthropic}

func fuzzFormat(b uint8) Format { return fuzzFormats[int(b)%len(fuzzFormats)] }

// formatByte is fuzzFormat's inverse, for seeds.
func formatByte(f Format) uint8 {
	for i, g := range fuzzFormats {
		if g == f {
			return uint8(i)
		}
	}
	panic("unknown format")
}

// recordedSeeds returns the recorded responses, each cut to at most about maxSeedBytes at
// event boundaries, with their format.
func recordedSeeds(tb testing.TB) []fixture {
	tb.Helper()
	dir := fixtures.Dir(tb)
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var out []fixture
	for _, e := range entries {
		name := e.Name()
		if name == "expected.json" || !(strings.HasSuffix(name, ".sse") || strings.HasSuffix(name, ".json")) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		if len(data) > maxSeedBytes && strings.HasSuffix(name, ".sse") {
			data = headAndTail(data, maxSeedBytes/2)
		}
		out = append(out, fixture{name: name, data: data})
	}
	return out
}

// headAndTail keeps the events of stream that start within its first n bytes and those that
// end within its last n.
func headAndTail(stream []byte, n int) []byte {
	var events [][]byte
	sc := NewScanner(bytes.NewReader(stream), 0)
	for {
		ev, err := sc.Next()
		if err != nil {
			break
		}
		events = append(events, bytes.Clone(ev.Raw))
	}
	var head, tail []byte
	for _, ev := range events {
		if len(head) >= n {
			break
		}
		head = append(head, ev...)
	}
	for i := len(events) - 1; i >= 0 && len(tail)+len(events[i]) <= n && len(head)+len(tail) < len(stream); i-- {
		tail = append(bytes.Clone(events[i]), tail...)
	}
	return append(head, tail...)
}

// checkPromises fails unless r keeps the promises Meter.Result makes: every count inside
// [0, pricing.MaxTokens] and no part larger than its whole (pricing.Usage.Clamp's rules), no
// usage without a report, estimates that are never negative, and names and ids bounded.
func checkPromises(t *testing.T, r Result) {
	t.Helper()
	u := r.Usage
	for _, v := range []int64{u.Input, u.CacheRead, u.CacheWrite, u.Output, u.CacheWrite1h, u.AudioInput, u.AudioOutput} {
		if v < 0 || v > pricing.MaxTokens {
			t.Fatalf("usage %+v has a count outside [0, %d]", u, int64(pricing.MaxTokens))
		}
	}
	if u != u.Clamp() {
		t.Fatalf("usage %+v is not clamped: a part exceeds its total (Clamp gives %+v)", u, u.Clamp())
	}
	if !r.Reported && u != (pricing.Usage{}) {
		t.Fatalf("usage %+v without a report", u)
	}
	if r.OutputChars < 0 || r.AudioOutput < 0 || r.AudioOutput > maxEstimatedTokens {
		t.Fatalf("output chars %d, audio output %d", r.OutputChars, r.AudioOutput)
	}
	out, audio := r.EstimatedOutput()
	if out < 0 || audio < 0 || out > maxEstimatedTokens || audio > out {
		t.Fatalf("estimated output %d, audio %d of it", out, audio)
	}
	if len(r.Model) > maxModelName || len(r.ResponseID) > maxModelName || len(r.SpokenIDs) > maxSpokenIDs {
		t.Fatalf("model %d bytes, response id %d bytes, %d spoken ids", len(r.Model), len(r.ResponseID), len(r.SpokenIDs))
	}
	seen := map[string]bool{}
	for _, id := range r.SpokenIDs {
		if id == "" || len(id) > maxModelName || seen[id] {
			t.Fatalf("spoken ids %q: empty, too long or repeated", r.SpokenIDs)
		}
		seen[id] = true
	}
}

// meterReads meters the stream r as the proxy does: each event the scanner splits from it, in
// whatever reads r makes. ok is false when the scan failed (an event over max).
func meterReads(r io.Reader, f Format, max int) (res Result, ok bool) {
	m := NewMeter(f)
	sc := NewScanner(r, max)
	for {
		ev, err := sc.Next()
		if errors.Is(err, io.EOF) {
			return m.Result(), true
		}
		if err != nil {
			return m.Result(), false
		}
		m.Event(ev)
	}
}

// chunks cuts in into reads of the sizes cuts gives (each mod 64, 0 an empty read, as
// FuzzScanner does), the rest in one.
func chunks(in, cuts []byte) [][]byte {
	var out [][]byte
	empty := 0
	for _, c := range cuts {
		n := min(int(c%64), len(in))
		if n == 0 {
			if empty++; empty > maxEmptyReads/2 {
				continue
			}
		}
		out = append(out, in[:n])
		in = in[n:]
	}
	return append(out, in)
}

// FuzzMeterStream meters any stream in any format, read whole and cut into any reads: the
// result keeps Result's promises, is the same however the stream was cut (a usage that
// depended on where a read ended would bill the same answer differently) and whichever line
// ends it uses (LF, CRLF, CR), and does not change
// when the bytes it was read from are overwritten (the scanner reuses its memory; a result
// holding a view of it would change under the caller).
func FuzzMeterStream(f *testing.F) {
	for _, fx := range recordedSeeds(f) {
		if strings.HasSuffix(fx.name, ".sse") {
			f.Add(fx.data, []byte{7, 0, 13, 1, 63, 2, 5}, formatByte(formatOf(fx.name)))
		}
	}
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":-3,\"total_tokens\":1e30}}\r\n\r\n"), []byte{1, 1}, formatByte(FormatChat))
	f.Add([]byte("event: message_delta\ndata: {\"usage\":{\"output_tokens\":3,\"cache_creation\":{\"ephemeral_1h_input_tokens\":9}}}\n\n"), []byte{}, formatByte(FormatAnthropic))
	f.Fuzz(func(t *testing.T, in, cuts []byte, format uint8) {
		fm := fuzzFormat(format)
		whole := bytes.Clone(in)
		want, wantOK := meterReads(bytes.NewReader(whole), fm, 0)
		checkPromises(t, want)
		again := want
		again.SpokenIDs = append([]string(nil), want.SpokenIDs...)
		for i := range whole {
			whole[i] = '#'
		}
		if !reflect.DeepEqual(again, want) {
			t.Fatalf("result changed when its input was overwritten: %+v, was %+v", want, again)
		}
		cut := bytes.Clone(in)
		got, gotOK := meterReads(&emptyReadsReader{chunks: chunks(cut, cuts)}, fm, 0)
		if gotOK != wantOK || !reflect.DeepEqual(got, again) {
			t.Fatalf("read in pieces: %+v (scan ok %v)\nread whole: %+v (scan ok %v)", got, gotOK, again, wantOK)
		}
		if bytes.IndexByte(in, '\r') >= 0 {
			return
		}
		// The same stream with its lines ended by CRLF or CR (a proxy on the way that rewrites
		// line ends, a server on another stack) is the same answer, billed the same.
		for _, end := range []string{"\r\n", "\r"} {
			other := bytes.ReplaceAll(in, []byte("\n"), []byte(end))
			got, gotOK := meterReads(&emptyReadsReader{chunks: chunks(other, cuts)}, fm, 0)
			if gotOK != wantOK || !reflect.DeepEqual(got, again) {
				t.Fatalf("lines ended %q: %+v (scan ok %v)\nended LF: %+v (scan ok %v)", end, got, gotOK, again, wantOK)
			}
		}
	})
}

// FuzzMeterBody meters any whole answer in any format: the result keeps Result's promises,
// bills no less than an OpenAI-style report says (checkNotUnderReport) and does not hold the
// body's memory; for the OpenAI formats, whose chunks and bodies carry the
// same usage object, the body's usage is the one its object carries as a stream's event (the
// audio part aside: a body's audio is a file, timed as one, a stream's raw PCM).
func FuzzMeterBody(f *testing.F) {
	for _, fx := range recordedSeeds(f) {
		if strings.HasSuffix(fx.name, ".json") {
			f.Add(fx.data, formatByte(formatOf(fx.name)))
		}
	}
	f.Add([]byte("\xEF\xBB\xBF {\"usage\":{\"input_tokens\":7,\"input_tokens_details\":{\"cached_tokens\":9}}}"), formatByte(FormatResponses))
	f.Add([]byte(`{"choices":[{"message":{"audio":{"id":"a","data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAgD4AAAB9AAACABAAZGF0YQAAAAA="}}}],"usage":{"completion_tokens":1}}`), formatByte(FormatChat))
	f.Add([]byte(llamaOwnFinal(0, "ab", 90, 16, true)), formatByte(FormatCompletions))
	f.Add([]byte("["+llamaOwnFinal(0, "ab", 90, 16, true)+","+llamaOwnFinal(1, "cd", 9, 1, true)+"]"), formatByte(FormatCompletions))
	f.Fuzz(func(t *testing.T, body []byte, format uint8) {
		fm := fuzzFormat(format)
		b := bytes.Clone(body)
		m := NewMeter(fm)
		m.Body(b)
		res := m.Result()
		checkPromises(t, res)
		keep := res
		keep.SpokenIDs = append([]string(nil), res.SpokenIDs...)
		for i := range b {
			b[i] = '#'
		}
		if !reflect.DeepEqual(keep, res) {
			t.Fatalf("result changed when its body was overwritten: %+v, was %+v", res, keep)
		}
		checkNotUnderReport(t, fm, body, res)
		if fm != FormatChat && fm != FormatCompletions && fm != FormatEmbeddings {
			return
		}
		data := bytes.TrimSpace(body)
		if len(data) == 0 || data[0] != '{' {
			return
		}
		ev := NewMeter(fm)
		ev.Event(Event{Data: data})
		er := ev.Result()
		// A spoken answer's audio is timed apart in a body (a file) and a stream (raw PCM).
		er.Usage.AudioOutput, res.Usage.AudioOutput = 0, 0
		if er.Usage != res.Usage || er.Reported != res.Reported {
			t.Fatalf("as a body: usage %+v reported %v; as an event: %+v reported %v", res.Usage, res.Reported, er.Usage, er.Reported)
		}
	})
}

// checkNotUnderReport fails when the usage metered of an OpenAI-style body (chat, completions,
// embeddings, Responses) bills fewer tokens than the body's one top-level usage report says:
// its prompt (input, cache reads and writes) fewer than prompt_tokens, its output fewer than
// completion_tokens, or the whole fewer than total_tokens. The gateway never bills less than
// the provider charged it. Counts are read as integers, clamped to [0, pricing.MaxTokens] as
// the meter does; a body with another or no report is not checked.
func checkNotUnderReport(t *testing.T, fm Format, body []byte, res Result) {
	t.Helper()
	if fm == FormatAnthropic {
		return
	}
	data := TrimBody(body)
	if len(data) == 0 || data[0] != '{' || !gjson.ValidBytes(data) {
		return
	}
	var usages []gjson.Result
	gjson.ParseBytes(data).ForEach(func(k, v gjson.Result) bool {
		if k.Str == "usage" {
			usages = append(usages, v)
		}
		return true
	})
	if len(usages) != 1 || !usages[0].IsObject() {
		return
	}
	figure := func(names ...string) (int64, bool) {
		for _, n := range names {
			v := usages[0].Get(n)
			if v.Type != gjson.Number {
				continue
			}
			if v.Num != math.Trunc(v.Num) {
				return 0, false // no provider counts a part of a token
			}
			return max(0, min(v.Int(), pricing.MaxTokens)), true
		}
		return 0, false
	}
	prompt, promptSeen := figure("prompt_tokens", "input_tokens")
	completion, completionSeen := figure("completion_tokens", "output_tokens")
	total, totalSeen := figure("total_tokens")
	u := res.Usage
	billedPrompt := u.Input + u.CacheRead + u.CacheWrite
	if (promptSeen && billedPrompt < prompt) || (completionSeen && u.Output < completion) ||
		(totalSeen && billedPrompt+u.Output < total) {
		t.Fatalf("report %s billed as %+v: fewer tokens than it says", usages[0].Raw, u)
	}
}
