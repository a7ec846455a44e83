package metering

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fixtures"
)

// expectation is one entry of expected.json.
type expectation struct {
	Input         int64 `json:"input"`
	CacheRead     int64 `json:"cache_read"`
	CacheWrite    int64 `json:"cache_write"`
	Output        int64 `json:"output"`
	Reported      bool  `json:"reported"`
	UpstreamError bool  `json:"upstream_error"`
}

type fixture struct {
	name string
	data []byte
	want expectation
}

// loadFixtures returns every recorded response with its expectation, failing when a file has
// no expectation or an expectation has no file.
func loadFixtures(tb testing.TB) []fixture {
	tb.Helper()
	dir := fixtures.Dir(tb)
	raw, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	if err != nil {
		tb.Fatal(err)
	}
	want := map[string]expectation{}
	if err := json.Unmarshal(raw, &want); err != nil {
		tb.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var out []fixture
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || name == "expected.json" || !(strings.HasSuffix(name, ".sse") || strings.HasSuffix(name, ".json")) {
			continue
		}
		w, ok := want[name]
		if !ok {
			tb.Errorf("%s has no entry in expected.json", name)
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		seen[name] = true
		out = append(out, fixture{name, data, w})
	}
	for name := range want {
		if !seen[name] {
			tb.Errorf("expected.json names %s, which is not in %s", name, dir)
		}
	}
	if len(out) == 0 {
		tb.Fatal("no fixtures found")
	}
	return out
}

func formatOf(name string) Format {
	switch {
	case strings.HasPrefix(name, "anthropic_"):
		return FormatAnthropic
	case strings.Contains(name, "responses"):
		return FormatResponses
	case strings.Contains(name, "embeddings"):
		return FormatEmbeddings
	case strings.Contains(name, "legacy_completions"):
		return FormatCompletions
	}
	return FormatChat
}

// scanned is the outcome of scanning a stream: copies of its events and their Raw joined.
type scanned struct {
	events []Event
	raw    []byte
	res    Result
}

// meterStream scans r to the end, metering each event, and fails on any error but io.EOF.
func meterStream(tb testing.TB, r io.Reader, f Format) scanned {
	tb.Helper()
	var out scanned
	m := NewMeter(f)
	sc := NewScanner(r, 1<<20)
	for {
		ev, err := sc.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("Next: %v", err)
		}
		m.Event(ev)
		out.raw = append(out.raw, ev.Raw...)
		out.events = append(out.events, copyEvent(ev))
	}
	out.res = m.Result()
	return out
}

func copyEvent(ev Event) Event {
	c := Event{Name: ev.Name, Raw: bytes.Clone(ev.Raw), Unterminated: ev.Unterminated}
	if ev.Data != nil {
		c.Data = append([]byte{}, ev.Data...)
	}
	return c
}

func meterFixture(tb testing.TB, fx fixture, r io.Reader) scanned {
	tb.Helper()
	f := formatOf(fx.name)
	if strings.HasSuffix(fx.name, ".json") {
		m := NewMeter(f)
		m.Body(fx.data)
		return scanned{raw: fx.data, res: m.Result()}
	}
	return meterStream(tb, r, f)
}

func checkResult(t *testing.T, name string, got Result, want expectation) {
	t.Helper()
	if got.Reported != want.Reported || got.UpstreamError != want.UpstreamError {
		t.Errorf("%s: reported=%v upstream_error=%v, want %v %v", name, got.Reported, got.UpstreamError, want.Reported, want.UpstreamError)
	}
	if !want.Reported {
		return
	}
	u := got.Usage
	if u.Input != want.Input || u.CacheRead != want.CacheRead || u.CacheWrite != want.CacheWrite || u.Output != want.Output {
		t.Errorf("%s: usage %+v, want input=%d cache_read=%d cache_write=%d output=%d",
			name, u, want.Input, want.CacheRead, want.CacheWrite, want.Output)
	}
}

func toCRLF(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
}

func TestFixtures(t *testing.T) {
	for _, fx := range loadFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			got := meterFixture(t, fx, bytes.NewReader(fx.data))
			checkResult(t, fx.name, got.res, fx.want)
			if !bytes.Equal(got.raw, fx.data) {
				t.Errorf("Raw of all events differs from the input")
			}
		})
	}
}

func TestFixturesCRLF(t *testing.T) {
	for _, fx := range loadFixtures(t) {
		fx.data = toCRLF(fx.data)
		t.Run(fx.name, func(t *testing.T) {
			got := meterFixture(t, fx, bytes.NewReader(fx.data))
			checkResult(t, fx.name, got.res, fx.want)
			if !bytes.Equal(got.raw, fx.data) {
				t.Errorf("Raw of all events differs from the input")
			}
		})
	}
}

// TestFixturesEverySplit feeds each small stream as two reads split at every offset, in LF
// and CRLF form, so every field, UTF-8 sequence and CR/LF pair is cut somewhere.
func TestFixturesEverySplit(t *testing.T) {
	const maxSize = 8 << 10
	for _, fx := range loadFixtures(t) {
		if !strings.HasSuffix(fx.name, ".sse") || len(fx.data) > maxSize {
			continue
		}
		for _, variant := range []struct {
			name string
			data []byte
		}{{"LF", fx.data}, {"CRLF", toCRLF(fx.data)}} {
			t.Run(fx.name+"/"+variant.name, func(t *testing.T) {
				f := formatOf(fx.name)
				whole := meterStream(t, bytes.NewReader(variant.data), f)
				checkResult(t, fx.name, whole.res, fx.want)
				for k := 0; k <= len(variant.data); k++ {
					got := meterStream(t, &chunkReader{chunks: [][]byte{variant.data[:k], variant.data[k:]}}, f)
					if !reflect.DeepEqual(got.res, whole.res) {
						t.Fatalf("split at %d: result %+v, unsplit %+v", k, got.res, whole.res)
					}
					if !bytes.Equal(got.raw, variant.data) {
						t.Fatalf("split at %d: Raw of all events differs from the input", k)
					}
					if !sameEvents(got.events, whole.events) {
						t.Fatalf("split at %d: events differ from the unsplit scan", k)
					}
				}
			})
		}
	}
}

func sameEvents(a, b []Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || (a[i].Data == nil) != (b[i].Data == nil) ||
			!bytes.Equal(a[i].Data, b[i].Data) || !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

// chunkReader returns its chunks one per Read, as a network connection would.
type chunkReader struct {
	chunks [][]byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.chunks) > 0 {
		c := r.chunks[0]
		if len(c) == 0 {
			r.chunks = r.chunks[1:]
			continue
		}
		n := copy(p, c)
		r.chunks[0] = c[n:]
		return n, nil
	}
	return 0, io.EOF
}

func BenchmarkScanner(b *testing.B) {
	data := bigStream(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	r := bytes.NewReader(data)
	for b.Loop() {
		r.Reset(data)
		sc := NewScanner(r, 1<<20)
		for {
			if _, err := sc.Next(); err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
		}
	}
}

func BenchmarkMeterChatStream(b *testing.B) {
	data := bigStream(b)
	events := meterStream(b, bytes.NewReader(data), FormatChat).events
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		m := NewMeter(FormatChat)
		for _, ev := range events {
			m.Event(ev)
		}
		if !m.Result().Reported {
			b.Fatal("no usage")
		}
	}
}

// bigStream is the largest recorded chat stream: 955 chunks, usage on the last one.
func bigStream(b *testing.B) []byte {
	data, err := os.ReadFile(filepath.Join(fixtures.Dir(b), "together_via_hf_router_chat_stream_flat_cached_tokens.sse"))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkIsUsageOnlyChunk runs the usage-only check over every chunk of a recorded stream,
// as the proxy does on a stream whose client did not ask for usage. Like OpenAI's, every chunk
// of it carries "usage" (null until the last, whose usage rides on its final content chunk),
// so none is usage-only and every one reaches the check past the cheap "usage" test.
func BenchmarkIsUsageOnlyChunk(b *testing.B) {
	data := bigStream(b)
	events := meterStream(b, bytes.NewReader(data), FormatChat).events
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		for _, ev := range events {
			if IsUsageOnlyChunk(ev.Data) {
				b.Fatalf("usage-only chunk found: %s", ev.Data)
			}
		}
	}
}

// BenchmarkPromptEstimates is the estimate every call's request goes through before its
// hold: the prompt's tokens and, apart, its audio, on a chat request of a few turns.
func BenchmarkPromptEstimates(b *testing.B) {
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"system","content":"You are a careful assistant for the billing team."},
		{"role":"user","content":"Summarise yesterday's invoices by customer and flag anything over budget."},
		{"role":"assistant","content":"Here is the summary you asked for, grouped by customer, with the overruns flagged."},
		{"role":"user","content":[{"type":"text","text":"And this one?"},{"type":"image_url","image_url":{"url":"https://example.com/i.png"}}]}]}`)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = EstimatePrompt(FormatChat, body)
	}
}
