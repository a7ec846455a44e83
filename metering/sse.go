// Package metering finds out what a call used: it splits upstream SSE streams into events
// without changing a byte of them, and extracts the provider's usage report per wire format.
package metering

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// defaultMaxEvent is the event size limit used when NewScanner is given none. It is large
// because the Responses API repeats the whole generated output in its final event.
const defaultMaxEvent = 8 << 20

const (
	// minRead is the least free space offered to each Read, so a slow trickle of bytes does
	// not turn into a flood of tiny reads.
	minRead = 4 << 10
	// initialBuf is enough for the typical chunk of every provider seen, so most streams
	// never grow the buffer.
	initialBuf = 16 << 10
	// maxEmptyReads bounds how long a Reader may return (0, nil) before it is declared stuck.
	maxEmptyReads = 100
	// maxEventCeiling keeps maxEvent + buffer arithmetic far from overflowing int.
	maxEventCeiling = 1 << 40
)

// ErrEventTooLarge is returned (wrapped with the limit) when one event's raw bytes exceed the
// scanner's maxEvent: the proxy must not buffer without bound on behalf of a broken upstream.
var ErrEventTooLarge = errors.New("metering: SSE event too large")

var utf8BOM = []byte("\xEF\xBB\xBF")

// Event is one SSE event as read from the upstream.
type Event struct {
	Name string // value of the last `event:` field, "" if none
	Data []byte // `data:` values joined with "\n", nil if the event had no data line
	Raw  []byte // the exact bytes received, terminating blank line and comments included
	// Unterminated: the stream ended inside this event (no blank line closed it). Whether
	// the end was clean is the next call's answer.
	Unterminated bool
}

// Scanner splits an SSE byte stream into events. The Raw of all events concatenated is the
// stream exactly, so the proxy can forward Raw and meter Data from the same pass. It reads
// only when the buffer holds no complete event, so an event is handed on as soon as its
// blank line arrives.
type Scanner struct {
	r   io.Reader
	max int

	buf     []byte // buf[:end] is valid; buf[evStart:end] is the unreturned input
	end     int
	evStart int   // first byte of the event being scanned
	pos     int   // first byte of the line being scanned
	rerr    error // the Reader's error, acted on once the buffered bytes are used up
	done    error // terminal result of Next, repeated on every later call
	started bool  // the stream's first line has been seen (only it may carry a BOM)
	// skipLF: the last event ended with a blank line whose CR was the last byte read. An LF
	// that comes next is the rest of that CRLF, not a blank line of its own: it is passed on
	// as the first byte of the next event's Raw and otherwise skipped.
	skipLF   bool
	lead     int  // 1 when the event being scanned begins with such an LF (not counted in max)
	loneCR   bool // the event's last line so far ended in a CR alone: the stream uses CR endings
	lf, cr   byteFinder
	emptyRds int
	// beforeRead runs before each read of r (BeforeRead).
	beforeRead func()

	// The event under construction.
	name    string
	nData   int
	dataOff int // absolute offset in buf of the only data value while nData == 1
	dataLen int
	join    []byte // joined data once an event has two or more data lines
	names   [8]string
	nameIdx int
}

// NewScanner returns a Scanner that fails any event larger than maxEvent bytes (raw, line
// endings included); maxEvent <= 0 means defaultMaxEvent. Memory stays below about
// maxEvent plus one read of buffer.
func NewScanner(r io.Reader, maxEvent int) *Scanner {
	if maxEvent <= 0 {
		maxEvent = defaultMaxEvent
	}
	maxEvent = min(maxEvent, maxEventCeiling)
	return &Scanner{r: r, max: maxEvent, lf: byteFinder{c: '\n', at: -1}, cr: byteFinder{c: '\r', at: -1}}
}

// NewBodyScanner returns a Scanner over b, a stream already held whole in memory (an event
// stream that came under another content type, read whole): its events are read in place, none
// copied, and none is too large, since b bounds them all. An event over a streamed relay's
// limit cuts that relay, and its caller never has it; a body held whole is sent whole, so every
// event of it must be read for what it costs.
func NewBodyScanner(b []byte) *Scanner {
	s := NewScanner(nil, maxEventCeiling)
	s.buf, s.end, s.rerr = b, len(b), io.EOF
	return s
}

// BeforeRead sets f to run before each read of the stream, the one moment the Scanner may wait
// for its source: a relay that writes the events it is handed without flushing each one can
// flush there, so events that arrived together go out in one write and none is held while
// the source is waited for.
func (s *Scanner) BeforeRead(f func()) { s.beforeRead = f }

// Next returns the next event. At the end of the stream, bytes that no blank line ended are
// returned as a last event before the error, so that every byte received can be passed on;
// the error is io.EOF on a clean end. The Event's slices are valid until the next call.
func (s *Scanner) Next() (Event, error) {
	if s.done != nil {
		return Event{}, s.done
	}
	s.beginEvent()
	for {
		ev, ok, err := s.scanLines(s.rerr != nil)
		if err != nil {
			return Event{}, s.fail(err)
		}
		if ok {
			return ev, nil
		}
		if s.end-s.evStart-s.lead > s.max { // incomplete already, so its final size is larger still
			return Event{}, s.fail(s.tooLarge())
		}
		if s.rerr != nil {
			return s.finishAtEnd()
		}
		s.fill()
	}
}

func (s *Scanner) beginEvent() {
	s.evStart = s.pos
	s.lead = 0
	s.loneCR = false
	s.name = ""
	s.nData = 0
}

// scanLines consumes complete lines from s.pos until one is blank, which completes the
// event. A CR at the end of the buffer is not a complete line ending before EOF, the next
// read may bring the LF of the same CRLF, except when it ends the blank line of an event
// written with CR endings: the event is then complete either way (see skipLF).
func (s *Scanner) scanLines(atEOF bool) (Event, bool, error) {
	for {
		if s.skipLF && s.pos < s.end {
			s.skipLF = false
			if s.buf[s.pos] == '\n' {
				s.pos++
				s.lead = 1
				continue
			}
		}
		lineEnd, next, ok := s.lineEnd(atEOF)
		if !ok {
			return Event{}, false, nil
		}
		start := s.pos
		s.pos = next
		s.loneCR = next == lineEnd+1 && s.buf[lineEnd] == '\r'
		if s.line(start, lineEnd) {
			if s.pos-s.evStart-s.lead > s.max {
				return Event{}, false, s.tooLarge()
			}
			return s.event(), true, nil
		}
	}
}

// lineEnd finds the end of the line starting at s.pos and the start of the one after it.
func (s *Scanner) lineEnd(atEOF bool) (end, next int, ok bool) {
	lf := s.lf.find(s.buf, s.pos, s.end)
	to := s.end
	if lf >= 0 {
		to = lf
	}
	cr := s.cr.find(s.buf, s.pos, to)
	switch {
	case cr >= 0 && cr+1 < s.end:
		if s.buf[cr+1] == '\n' {
			return cr, cr + 2, true
		}
		return cr, cr + 1, true
	case cr >= 0 && atEOF:
		return cr, cr + 1, true
	case cr == s.pos && s.loneCR:
		// A blank line ending in a CR that is the last byte read, in an event whose lines
		// end in a CR alone: the event is complete whether or not an LF follows. Handing it
		// on now, not when the next event's first byte arrives, is what keeps a stream with
		// CR line endings live; an LF that follows is swallowed by the next call (skipLF).
		// (A CRLF stream cut between the two is still waited for: its LF is on its way.)
		s.skipLF = true
		return cr, cr + 1, true
	case cr >= 0:
		return 0, 0, false
	case lf >= 0:
		return lf, lf + 1, true
	}
	return 0, 0, false
}

// line interprets buf[start:end], one line without its ending, and reports whether it was
// blank (the end of the event).
func (s *Scanner) line(start, end int) bool {
	if !s.started {
		s.started = true
		if bytes.HasPrefix(s.buf[start:end], utf8BOM) {
			start += len(utf8BOM)
		}
	}
	if start == end {
		return true
	}
	line := s.buf[start:end]
	if line[0] == ':' {
		return false
	}
	field, value := line, line[len(line):]
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		s.addData(end-len(value), len(value))
	case "event":
		s.name = s.intern(value)
	}
	return false
}

// addData keeps a single data line as a window into buf (no copy, the common case) and
// joins only when a second line arrives.
func (s *Scanner) addData(off, n int) {
	switch s.nData {
	case 0:
		s.dataOff, s.dataLen = off, n
	case 1:
		s.join = append(s.join[:0], s.buf[s.dataOff:s.dataOff+s.dataLen]...)
		fallthrough
	default:
		s.join = append(s.join, '\n')
		s.join = append(s.join, s.buf[off:off+n]...)
	}
	s.nData++
}

// intern returns value as a string, reusing a recent one when equal: event names repeat on
// almost every event of a stream, and converting each would allocate.
func (s *Scanner) intern(value []byte) string {
	for _, n := range s.names {
		if n == string(value) {
			return n
		}
	}
	n := string(value)
	s.names[s.nameIdx] = n
	s.nameIdx = (s.nameIdx + 1) % len(s.names)
	return n
}

func (s *Scanner) event() Event {
	ev := Event{Name: s.name, Raw: s.buf[s.evStart:s.pos:s.pos]}
	switch s.nData {
	case 0:
	case 1:
		e := s.dataOff + s.dataLen
		ev.Data = s.buf[s.dataOff:e:e]
	default:
		ev.Data = s.join[:len(s.join):len(s.join)]
	}
	return ev
}

// finishAtEnd returns the bytes left when the Reader has ended, as a last event whose final
// line may lack its ending, then the Reader's error on the next call.
func (s *Scanner) finishAtEnd() (Event, error) {
	if s.pos < s.end {
		start := s.pos
		s.pos = s.end
		s.line(start, s.end)
	}
	if s.evStart == s.end {
		return Event{}, s.fail(s.rerr)
	}
	s.done = s.rerr
	ev := s.event()
	ev.Unterminated = true
	return ev, nil
}

// fill reads once into the free tail of the buffer, first moving the unreturned bytes to the
// front or growing the buffer when the tail is short, never beyond max + minRead + 1.
func (s *Scanner) fill() {
	if s.buf == nil {
		s.buf = make([]byte, min(initialBuf, s.max+minRead+1))
	}
	if s.evStart == s.end {
		s.shift(s.evStart)
	}
	if len(s.buf)-s.end < minRead && s.evStart > 0 {
		copy(s.buf, s.buf[s.evStart:s.end])
		s.shift(s.evStart)
	}
	if len(s.buf)-s.end < minRead {
		n := min(max(2*len(s.buf), s.end+minRead), s.max+minRead+1)
		if n > len(s.buf) {
			b := make([]byte, n)
			copy(b, s.buf[:s.end])
			s.buf = b
		}
	}
	if s.beforeRead != nil {
		s.beforeRead()
	}
	n, err := s.r.Read(s.buf[s.end:])
	if n < 0 || n > len(s.buf)-s.end {
		s.rerr = fmt.Errorf("metering: reader returned invalid count %d", n)
		return
	}
	s.end += n
	switch {
	case err != nil:
		s.rerr = err
	case n > 0:
		s.emptyRds = 0
	default:
		if s.emptyRds++; s.emptyRds >= maxEmptyReads {
			s.rerr = io.ErrNoProgress
		}
	}
}

// shift moves every offset back by d after the buffer's live bytes moved to its front.
func (s *Scanner) shift(d int) {
	s.end -= d
	s.evStart -= d
	s.pos -= d
	s.dataOff -= d
	s.lf.shift(d)
	s.cr.shift(d)
}

func (s *Scanner) tooLarge() error {
	return fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, s.max)
}

func (s *Scanner) fail(err error) error {
	s.done = err
	return err
}

// byteFinder remembers where it last looked for one byte, so that an event arriving in many
// small reads (or a stream using only CR) is searched once, not once per read or per line.
type byteFinder struct {
	c     byte
	at    int // offset of the next c found, valid while >= the position searched from
	clear int // no c lies between the search position and clear
}

// find returns the offset of the first c in b[from:to], or -1. from never decreases between
// calls except through shift.
func (f *byteFinder) find(b []byte, from, to int) int {
	if f.at >= from {
		if f.at < to {
			return f.at
		}
		return -1
	}
	if start := max(from, f.clear); start < to {
		if i := bytes.IndexByte(b[start:to], f.c); i >= 0 {
			f.at = start + i
			return f.at
		}
	}
	f.at = -1
	f.clear = max(f.clear, to)
	return -1
}

func (f *byteFinder) shift(d int) {
	if f.at >= 0 {
		f.at -= d
	}
	f.clear = max(0, f.clear-d)
}
