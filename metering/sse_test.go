package metering

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// want is an expected event; data "<nil>" stands for no data line.
type want struct {
	name, data, raw string
}

const noData = "<nil>"

// scanAll scans the chunks (one Read each) and returns copies of the events and the error
// that ended the scan.
func scanAll(t *testing.T, max int, chunks ...string) ([]Event, error) {
	t.Helper()
	r := &chunkReader{}
	for _, c := range chunks {
		r.chunks = append(r.chunks, []byte(c))
	}
	sc := NewScanner(r, max)
	var evs []Event
	for i := 0; ; i++ {
		if i > 1_000_000 {
			t.Fatal("scanner does not terminate")
		}
		ev, err := sc.Next()
		if err != nil {
			if _, err2 := sc.Next(); !errors.Is(err2, err) {
				t.Errorf("error not sticky: %v then %v", err, err2)
			}
			return evs, err
		}
		evs = append(evs, copyEvent(ev))
	}
}

func checkEvents(t *testing.T, got []Event, wants ...want) {
	t.Helper()
	if len(got) != len(wants) {
		t.Fatalf("got %d events %+v, want %d", len(got), got, len(wants))
	}
	for i, w := range wants {
		g := got[i]
		data := noData
		if g.Data != nil {
			data = string(g.Data)
		}
		if g.Name != w.name || data != w.data || string(g.Raw) != w.raw {
			t.Errorf("event %d: name=%q data=%q raw=%q, want %q %q %q", i, g.Name, data, g.Raw, w.name, w.data, w.raw)
		}
	}
}

func TestScannerLineEndings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		want   []want
	}{
		{"LF", []string{"data: a\n\ndata: b\n\n"}, []want{{"", "a", "data: a\n\n"}, {"", "b", "data: b\n\n"}}},
		{"CRLF", []string{"data: a\r\n\r\ndata: b\r\n\r\n"}, []want{{"", "a", "data: a\r\n\r\n"}, {"", "b", "data: b\r\n\r\n"}}},
		{"CR only", []string{"event: x\rdata: a\r\rdata: b\r\r"}, []want{{"x", "a", "event: x\rdata: a\r\r"}, {"", "b", "data: b\r\r"}}},
		{"mixed", []string{"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r\n"},
			[]want{{"", "a\nb\nc", "data: a\r\ndata: b\rdata: c\n\r\n"}, {"", "d", "data: d\r\r\n"}}},
		{"CRLF split across reads", []string{"data: a\r", "\n\r", "\ndata: b\r", "\r", "\n"},
			// "data: b" ends in a CR alone, so the blank line's CR ends the event at once; the
			// LF that follows is passed on as the next (last) event.
			[]want{{"", "a", "data: a\r\n\r\n"}, {"", "b", "data: b\r\r"}, {"", noData, "\n"}}},
		{"CR then non-LF across reads", []string{"data: a\r", "\r", "data: b\n\n"},
			[]want{{"", "a", "data: a\r\r"}, {"", "b", "data: b\n\n"}}},
		{"CR only, each event in its own read", []string{"data: a\r\r", "data: b\r\r"},
			[]want{{"", "a", "data: a\r\r"}, {"", "b", "data: b\r\r"}}},
		// The LF looked for after a CR-ended event is looked for once: LF-ended events after it
		// end at their own blank lines, which are not taken for that LF.
		{"CR-ended event, then LF-ended ones", []string{"data: a\r\r", "data: b\n\ndata: c\n\n"},
			[]want{{"", "a", "data: a\r\r"}, {"", "b", "data: b\n\n"}, {"", "c", "data: c\n\n"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := scanAll(t, 1<<20, tc.chunks...)
			if err != io.EOF {
				t.Fatalf("err %v, want io.EOF", err)
			}
			checkEvents(t, evs, tc.want...)
		})
	}
}

func TestScannerFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []want
	}{
		{"comments kept in Raw", ": OPENROUTER PROCESSING\n\n: ping\ndata: x\n\n",
			[]want{{"", noData, ": OPENROUTER PROCESSING\n\n"}, {"", "x", ": ping\ndata: x\n\n"}}},
		{"multi-line data", "data: {\"a\":\ndata:  1}\ndata\n\n", []want{{"", "{\"a\":\n 1}\n", "data: {\"a\":\ndata:  1}\ndata\n\n"}}},
		// Each event's lines are joined afresh: none of an earlier event's data leads a later one's.
		{"multi-line data, event after event", "data: {\"a\":\ndata: 1}\n\ndata: {\"b\":\ndata: 2}\n\n",
			[]want{{"", "{\"a\":\n1}", "data: {\"a\":\ndata: 1}\n\n"}, {"", "{\"b\":\n2}", "data: {\"b\":\ndata: 2}\n\n"}}},
		{"data without space", "data:x\n\ndata:\n\n", []want{{"", "x", "data:x\n\n"}, {"", "", "data:\n\n"}}},
		{"event, id, retry", "event: a\nid: 7\nretry: 10\nevent:b\ndata: d\n\n", []want{{"b", "d", "event: a\nid: 7\nretry: 10\nevent:b\ndata: d\n\n"}}},
		{"unknown field and no colon", "foo: bar\nevent\n\n", []want{{"", noData, "foo: bar\nevent\n\n"}}},
		// Field names are case-sensitive: an SDK ignores these, so the meter must too.
		{"field names in another case", "Data: x\nEVENT: e\n\n", []want{{"", noData, "Data: x\nEVENT: e\n\n"}}},
		{"blank lines alone", "\n\r\n", []want{{"", noData, "\n"}, {"", noData, "\r\n"}}},
		{"BOM at stream start", "\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n", []want{{"", "a", "\xEF\xBB\xBFdata: a\n\n"}, {"", noData, "\xEF\xBB\xBFdata: b\n\n"}}},
		{"trailing event without blank line", "data: a\n\nevent: e\ndata: b", []want{{"", "a", "data: a\n\n"}, {"e", "b", "event: e\ndata: b"}}},
		{"trailing line ending only", "data: a\n", []want{{"", "a", "data: a\n"}}},
		{"trailing CR", "data: a\r", []want{{"", "a", "data: a\r"}}},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := scanAll(t, 1<<20, tc.in)
			if err != io.EOF {
				t.Fatalf("err %v, want io.EOF", err)
			}
			checkEvents(t, evs, tc.want...)
		})
	}
}

func TestScannerUTF8Split(t *testing.T) {
	in := "data: {\"t\":\"héllo 🌟\"}\n\n"
	for k := 0; k <= len(in); k++ {
		for _, chunks := range [][]string{{in[:k], in[k:]}, strings.Split(in, "")} {
			evs, err := scanAll(t, 1<<20, chunks...)
			if err != io.EOF {
				t.Fatal(err)
			}
			checkEvents(t, evs, want{"", "{\"t\":\"héllo 🌟\"}", in})
		}
	}
}

func TestScannerLargeEvent(t *testing.T) {
	payload := strings.Repeat("x", 200<<10)
	in := "event: big\ndata: " + payload + "\n\ndata: after\n\n"
	// In 1000-byte reads, so the event spans hundreds of them.
	var chunks []string
	for s := in; len(s) > 0; {
		n := min(1000, len(s))
		chunks = append(chunks, s[:n])
		s = s[n:]
	}
	evs, err := scanAll(t, 1<<20, chunks...)
	if err != io.EOF {
		t.Fatal(err)
	}
	checkEvents(t, evs, want{"big", payload, "event: big\ndata: " + payload + "\n\n"}, want{"", "after", "data: after\n\n"})
}

// TestScannerDataOfAnEventMovedInItsBuffer: an event whose data line was read but whose
// blank line had not come when the buffer was compacted (its bytes moved to the front to make
// room for the next read) keeps its data: the data is where the event's bytes went.
func TestScannerDataOfAnEventMovedInItsBuffer(t *testing.T) {
	first := "data: first\n\n"
	// With the first event, the second's data line leaves less than one read of room in the
	// initial buffer: the next read moves the second event to the front.
	payload := `{"usage":{"completion_tokens":7},"pad":"` + strings.Repeat("x", initialBuf-minRead) + `"}`
	second := "data: " + payload + "\n"
	evs, err := scanAll(t, 1<<20, first+second, "\n")
	if err != io.EOF {
		t.Fatal(err)
	}
	checkEvents(t, evs, want{"", "first", first}, want{"", payload, second + "\n"})
}

func TestScannerTooLarge(t *testing.T) {
	small := "data: ok\n\n"
	big := "data: " + strings.Repeat("y", 300) + "\n\n"
	for _, tc := range []struct {
		name   string
		chunks []string
	}{
		{"one read", []string{small + big + small}},
		{"byte reads", strings.Split(small+big+small, "")},
		{"unterminated at EOF", []string{small, big[:len(big)-2]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := scanAll(t, 100, tc.chunks...)
			if !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("err %v, want ErrEventTooLarge", err)
			}
			checkEvents(t, evs, want{"", "ok", small})
		})
	}
	t.Run("exactly the limit", func(t *testing.T) {
		evs, err := scanAll(t, len(small), small, small)
		if err != io.EOF {
			t.Fatal(err)
		}
		checkEvents(t, evs, want{"", "ok", small}, want{"", "ok", small})
	})
	t.Run("exactly the limit, unterminated at EOF", func(t *testing.T) {
		// A stream cut after an event of exactly the limit, before its blank line: the bytes
		// are not past the limit, and the cut event is handed on (and metered) as any other.
		evs, err := scanAll(t, len("data: ok"), "data: ok")
		if err != io.EOF {
			t.Fatalf("err %v, want io.EOF after the cut event", err)
		}
		checkEvents(t, evs, want{"", "ok", "data: ok"})
	})
	t.Run("one byte past the limit", func(t *testing.T) {
		for _, chunks := range [][]string{{small}, strings.Split(small, "")} {
			if _, err := scanAll(t, len(small)-1, chunks...); !errors.Is(err, ErrEventTooLarge) {
				t.Fatalf("%d reads: err %v, want ErrEventTooLarge", len(chunks), err)
			}
		}
	})
	t.Run("CRLF tips it over", func(t *testing.T) {
		ev := "data: ok\r\n\r" // 11 bytes; with the LF of the final CRLF 12
		if _, err := scanAll(t, 11, ev, "\n"); !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err %v, want ErrEventTooLarge", err)
		}
	})
	t.Run("a CR-ended event is handed on before an LF comes", func(t *testing.T) {
		evs, err := scanAll(t, 10, "data: ok\r\r", "\ndata: ok\r\r")
		if err != io.EOF {
			t.Fatal(err)
		}
		checkEvents(t, evs, want{"", "ok", "data: ok\r\r"}, want{"", "ok", "\ndata: ok\r\r"})
	})
	t.Run("memory stays bounded", func(t *testing.T) {
		sc := NewScanner(infiniteReader{}, 64<<10)
		if _, err := sc.Next(); !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err %v, want ErrEventTooLarge", err)
		}
		if c := cap(sc.buf); c > 64<<10+2*minRead {
			t.Errorf("buffer grew to %d bytes for a 64 KiB limit", c)
		}
	})
}

// infiniteReader is an upstream that never ends its event.
type infiniteReader struct{}

func (infiniteReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

func TestScannerReaderErrors(t *testing.T) {
	t.Run("bytes before an error are returned first", func(t *testing.T) {
		boom := errors.New("connection reset")
		sc := NewScanner(io.MultiReader(strings.NewReader("data: a\n\ndata: part"), errReader{boom}), 0)
		for _, w := range []string{"a", "part"} {
			ev, err := sc.Next()
			if err != nil || string(ev.Data) != w {
				t.Fatalf("got %q %v, want %q", ev.Data, err, w)
			}
		}
		if _, err := sc.Next(); err != boom {
			t.Fatalf("err %v, want %v", err, boom)
		}
	})
	t.Run("stuck reader", func(t *testing.T) {
		sc := NewScanner(errReader{nil}, 0)
		if _, err := sc.Next(); err != io.ErrNoProgress {
			t.Fatalf("err %v, want io.ErrNoProgress", err)
		}
	})
	t.Run("data and EOF in one read", func(t *testing.T) {
		sc := NewScanner(dataEOFReader{"data: a\n\ndata: b"}, 0)
		var got []string
		for {
			ev, err := sc.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(ev.Data))
		}
		if strings.Join(got, ",") != "a,b" {
			t.Fatalf("got %q", got)
		}
	})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// dataEOFReader returns all its data together with io.EOF, which io.Reader allows.
type dataEOFReader struct{ s string }

func (r dataEOFReader) Read(p []byte) (int, error) {
	return copy(p, r.s), io.EOF
}

// TestScannerNoAllocs holds the hot path to its promise: after warm-up, scanning a stream of
// single-data-line events with repeated names allocates nothing per event.
func TestScannerNoAllocs(t *testing.T) {
	ev := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n"
	in := []byte(strings.Repeat(ev, 1000))
	r := bytes.NewReader(in)
	allocs := testing.AllocsPerRun(10, func() {
		r.Reset(in)
		sc := NewScanner(r, 1<<20)
		for {
			if _, err := sc.Next(); err != nil {
				break
			}
		}
	})
	if allocs > 5 { // the Scanner, its buffer, one name
		t.Errorf("%v allocations to scan 1000 events", allocs)
	}
}

// TestScannerFlagsAnEventTheStreamEndedIn: only an event no blank line closed is Unterminated,
// so the proxy can tell a half event (drop it after a break) from a whole one.
func TestScannerFlagsAnEventTheStreamEndedIn(t *testing.T) {
	for _, tc := range []struct {
		stream string
		last   bool // the last event is unterminated
	}{
		{"data: a\n\ndata: b\n\n", false},
		{"data: a\n\ndata: {\"half", true},
		{"data: a\r\n\r\n", false},
		{"data: a\n", true},
	} {
		sc := NewScanner(strings.NewReader(tc.stream), 1<<10)
		var last Event
		for {
			ev, err := sc.Next()
			if err != nil {
				break
			}
			last = ev
		}
		if last.Unterminated != tc.last {
			t.Errorf("%q: last event unterminated=%v, want %v", tc.stream, last.Unterminated, tc.last)
		}
	}
}

// stallReader returns its chunk once, then reports any further Read: an event complete in
// the first chunk must be handed on without another read (the upstream may be thinking).
type stallReader struct {
	chunk  string
	read   bool
	stalls int
}

func (r *stallReader) Read(p []byte) (int, error) {
	if r.read {
		r.stalls++
		return 0, errors.New("stalled: the scanner waited for more bytes")
	}
	r.read = true
	return copy(p, r.chunk), nil
}

func TestScannerHandsOnACompleteEventWithoutReadingAgain(t *testing.T) {
	for _, in := range []string{"data: a\n\n", "data: a\r\n\r\n", "data: a\r\r", ": keep-alive\r\r", "event: x\rdata: a\r\r"} {
		r := &stallReader{chunk: in}
		ev, err := NewScanner(r, 1<<10).Next()
		if err != nil || r.stalls != 0 || string(ev.Raw) != in {
			t.Errorf("%q: got %q, %v after %d extra reads; want the event without another read", in, ev.Raw, err, r.stalls)
		}
	}
}

// TestBodyScannerReadsAsAStreamDoes: a stream held whole (NewBodyScanner) splits into the events
// a Scanner reading it as it comes hands on, in every line ending and with its last event
// unended, and an event of any size is read (in place: nothing is copied).
func TestBodyScannerReadsAsAStreamDoes(t *testing.T) {
	events := []string{"event: a\ndata: {\"x\":1}\n\n", ": keep-alive\n\n", "data: one\ndata: two\n\n", "data: [DONE]\n\n"}
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		for _, unended := range []bool{false, true} {
			body := strings.ReplaceAll("\xEF\xBB\xBF"+strings.Join(events, ""), "\n", eol)
			if unended {
				body = strings.TrimSuffix(body, eol)
			}
			var want, got []Event
			sc := NewScanner(strings.NewReader(body), 1<<10)
			for ev, err := sc.Next(); err == nil; ev, err = sc.Next() {
				want = append(want, copyEvent(ev))
			}
			bs := NewBodyScanner([]byte(body))
			for ev, err := bs.Next(); err == nil; ev, err = bs.Next() {
				got = append(got, copyEvent(ev))
			}
			if _, err := bs.Next(); err != io.EOF {
				t.Errorf("eol %q unended %v: ended with %v, want io.EOF", eol, unended, err)
			}
			if len(want) != len(events) || !reflect.DeepEqual(got, want) {
				t.Errorf("eol %q unended %v:\n got %+v\nwant %+v", eol, unended, got, want)
			}
		}
	}
	big := "data: " + strings.Repeat("w", 1<<20) + "\n\n"
	b := []byte(big + "data: after\n\n")
	bs := NewBodyScanner(b)
	ev, err := bs.Next()
	if err != nil || len(ev.Data) != 1<<20 || &ev.Raw[0] != &b[0] {
		t.Fatalf("an event of 1 MiB: %v, %d bytes of data, read in place %v", err, len(ev.Data), err == nil && &ev.Raw[0] == &b[0])
	}
	if ev, err = bs.Next(); err != nil || string(ev.Data) != "after" {
		t.Fatalf("the event after it: %q, %v", ev.Data, err)
	}
}
