package metering

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// refEvent is what the reference splitter makes of one event.
type refEvent struct {
	name   string
	data   []byte // nil without a data line
	rawLen int
}

// reference splits an SSE stream the slow, obvious way: cut it into lines at CRLF, CR or LF,
// group the lines at blank ones, and read the fields of each group. Bytes after the last
// blank line form a last event.
func reference(in []byte) []refEvent {
	var out []refEvent
	var cur refEvent
	open := false
	first := true
	for i := 0; i < len(in); {
		j := i
		for j < len(in) && in[j] != '\r' && in[j] != '\n' {
			j++
		}
		term := 0
		if j < len(in) {
			term = 1
			if in[j] == '\r' && j+1 < len(in) && in[j+1] == '\n' {
				term = 2
			}
		}
		line := in[i:j]
		if first {
			line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF"))
			first = false
		}
		cur.rawLen += j + term - i
		open = true
		i = j + term
		if len(line) == 0 {
			out = append(out, cur)
			cur, open = refEvent{}, false
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value := string(line), ""
		if k := bytes.IndexByte(line, ':'); k >= 0 {
			field, value = string(line[:k]), string(line[k+1:])
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch field {
		case "data":
			if cur.data == nil {
				cur.data = []byte(value)
			} else {
				cur.data = append(append(cur.data, '\n'), value...)
			}
		case "event":
			cur.name = value
		}
	}
	if open {
		out = append(out, cur)
	}
	return out
}

// FuzzScanner checks the scanner against the reference for any input cut into any reads:
// same events, the input rebuilt exactly from Raw, and an event over the limit failing the
// scan at that event whatever the reads.
func FuzzScanner(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\r\n\r\n"), []byte{3, 1, 0, 7}, uint16(1000))
	f.Add([]byte("event: x\rdata: a\r\r: c\n\ndata"), []byte{8, 1, 1}, uint16(9))
	f.Add([]byte("\xEF\xBB\xBFdata:x\r\n\r"), []byte{1, 1, 1, 1}, uint16(3))
	f.Add([]byte("data: 1\ndata:2\ndata\n\n\n\r\r"), []byte{}, uint16(20))
	f.Fuzz(func(t *testing.T, in, cuts []byte, limit uint16) {
		max := int(limit) + 1
		var chunks [][]byte
		rest := in
		empty := 0
		for _, c := range cuts {
			n := min(int(c%32), len(rest)) // 0 is an empty read
			if n == 0 {
				if empty++; empty > maxEmptyReads/2 { // more in a row would be a stuck reader
					continue
				}
			}
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		r := &emptyReadsReader{chunks: chunks}

		want := reference(in)
		sc := NewScanner(r, max)
		var raw []byte
		var lens []int
		for i := 0; ; i++ {
			ev, err := sc.Next()
			// An event whose blank line's CR was the last byte read is handed on at once; the
			// LF of that CRLF, if it comes, leads the next Raw. Moved back to the event it
			// ends (an event of that LF alone dropped), the events are the reference's.
			if err == nil && len(raw) > 0 && raw[len(raw)-1] == '\r' && len(ev.Raw) > 0 && ev.Raw[0] == '\n' {
				raw = append(raw, '\n')
				lens[len(lens)-1]++
				if ev.Raw = ev.Raw[1:]; len(ev.Raw) == 0 {
					i--
					continue
				}
			}
			// The event handed on without its LF fits a limit one byte under the reference's.
			split := err == nil && i < len(want) && want[i].rawLen == max+1 && len(ev.Raw) == max && ev.Raw[max-1] == '\r'
			if i < len(want) && want[i].rawLen > max && !split {
				if !errors.Is(err, ErrEventTooLarge) {
					t.Fatalf("event %d of %d bytes, limit %d: err %v, want ErrEventTooLarge", i, want[i].rawLen, max, err)
				}
				return
			}
			if err == io.EOF {
				if i != len(want) {
					t.Fatalf("%d events, want %d", i, len(want))
				}
				break
			}
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if i >= len(want) {
				t.Fatalf("extra event %q", ev.Raw)
			}
			w := want[i]
			lens = append(lens, len(ev.Raw))
			if ev.Name != w.name || (ev.Data == nil) != (w.data == nil) || !bytes.Equal(ev.Data, w.data) {
				t.Fatalf("event %d: name=%q data=%q raw=%q, want %q %q (%d bytes)", i, ev.Name, ev.Data, ev.Raw, w.name, w.data, w.rawLen)
			}
			raw = append(raw, ev.Raw...)
		}
		for i, n := range lens {
			if n != want[i].rawLen {
				t.Fatalf("event %d: %d raw bytes, want %d", i, n, want[i].rawLen)
			}
		}
		if !bytes.Equal(raw, in) {
			t.Fatalf("Raw rebuilt %q, want %q", raw, in)
		}
	})
}

// emptyReadsReader is chunkReader that also returns its empty chunks as (0, nil) reads,
// which io.Reader allows and some connections do.
type emptyReadsReader struct {
	chunks [][]byte
}

func (r *emptyReadsReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}
