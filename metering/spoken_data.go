package metering

import "encoding/base64"

// spokenData measures one spoken answer's base64 data written in pieces as spokenAnswer
// measures it whole: its first clipPrefix characters say whether it is a WAV or MP3 file
// (isClipFile, clipHead), an MP3 stream's frames are walked as they are decoded, and its length
// times a WAV file or counts raw PCM.
type spokenData struct {
	n      int64   // characters written
	last   [2]byte // the last two, for base64Len's padding
	prefix []byte  // the first clipPrefix characters, until the kind is known
	kind   clipKind
	rate   int64 // a WAV file's byte rate
	dec    base64Stream
	walk   mp3Walk
}

// clipPrefix is how many characters of base64 data tell what it is: a WAV header or an ID3
// tag in its first 36 bytes, an MP3 frame followed by another (frames are at most 1 441 bytes).
const clipPrefix = 2048

type clipKind uint8

const (
	clipUnknown clipKind = iota // not yet known
	clipNone                    // no file: raw PCM
	clipWAV
	clipMP3
)

func (d *spokenData) write(s string) {
	d.n += int64(len(s))
	switch {
	case len(s) >= 2:
		d.last = [2]byte{s[len(s)-2], s[len(s)-1]}
	case len(s) == 1:
		d.last = [2]byte{d.last[1], s[0]}
	}
	if d.kind == clipUnknown {
		k := min(len(s), clipPrefix-len(d.prefix))
		d.prefix = append(d.prefix, s[:k]...)
		s = s[k:]
		if len(d.prefix) < clipPrefix {
			return
		}
		d.decide()
	}
	if d.kind == clipMP3 {
		d.dec.write(s, d.walk.push)
	}
}

// decide reads what the data is from its prefix (all of it when it is shorter), as
// spokenAnswer and clipMicros read the whole.
func (d *spokenData) decide() {
	data := string(d.prefix)
	d.prefix = nil
	d.kind = clipNone
	if !isClipFile(data) {
		return
	}
	kind, rate, off := clipHead(data)
	d.kind, d.rate = kind, rate
	if kind == clipMP3 {
		d.walk = newMP3Walk(off)
		d.dec.write(data, d.walk.push)
	}
}

// measure is the data's audio as spokenAnswer counts it: how long a file plays, else the bytes
// of raw PCM it decodes to.
func (d *spokenData) measure() (pcmBytes, clipMicros int64) {
	if d.kind == clipUnknown {
		d.decide()
	}
	var us int64
	switch d.kind {
	case clipWAV:
		us = wavMicros(d.n, d.rate)
	case clipMP3:
		d.dec.flush(d.walk.push)
		us = d.walk.end(int64(base64.StdEncoding.DecodedLen(int(d.n))))
	}
	if us > 0 {
		return 0, us
	}
	n := d.n * 3 / 4
	for i := 1; i >= 0 && int64(2-i) <= d.n && d.last[i] == '='; i-- {
		n--
	}
	return max(0, n), 0
}

// base64Stream decodes standard base64 written in pieces, as encoding/base64's decoder does
// ('\r' and '\n' skipped), up to the first quantum that is padded or not base64: what a
// decoder reads as the data's end.
type base64Stream struct {
	in    [1024]byte
	nin   int
	out   [768]byte
	ended bool
}

// write decodes s, handing what it decodes to emit a buffer at a time.
func (d *base64Stream) write(s string, emit func([]byte)) {
	for i := 0; i < len(s) && !d.ended; i++ {
		if c := s[i]; c != '\r' && c != '\n' {
			d.in[d.nin] = c
			if d.nin++; d.nin == len(d.in) {
				d.flush(emit)
			}
		}
	}
}

// flush decodes the whole quanta written; a last one cut short is none.
func (d *base64Stream) flush(emit func([]byte)) {
	if d.ended {
		return
	}
	whole := d.nin / 4 * 4
	n, err := base64.StdEncoding.Decode(d.out[:], d.in[:whole])
	if err != nil || n < whole/4*3 {
		d.ended = true
	}
	if n > 0 {
		emit(d.out[:n])
	}
	d.nin = copy(d.in[:], d.in[whole:d.nin])
}

// mp3Walk walks the MPEG audio Layer III frames of a decoded stream handed to it in pieces,
// from byte p on, as a decoder plays them: each frame counts the microseconds it plays, and
// bytes that are not one are skipped to the next that may start one (0xff). Past maxMP3Junk
// bytes skipped, the rest of the stream, from where the skip that passed it began, is timed
// at the lowest bit rate instead (cut). It keeps a frame header's 4 bytes.
type mp3Walk struct {
	p        int64   // where the next frame header is looked for, or where a skip began
	at       int64   // bytes handed to it so far
	hdr      [4]byte // the bytes at p, as they come
	nh       int
	scanning bool // a skip from p to the next 0xff
	micros   int64
	junk     int64
	cut      int64 // where the rest is timed at the lowest rate, or -1
}

func newMP3Walk(off int64) mp3Walk { return mp3Walk{p: off, cut: -1} }

// push walks the next bytes of the stream.
func (w *mp3Walk) push(b []byte) {
	for len(b) > 0 && w.cut < 0 {
		switch {
		case w.at < w.p:
			// Before the next header: a frame's body, or the tag before the first.
			k := min(int64(len(b)), w.p-w.at)
			b, w.at = b[k:], w.at+k
		case w.scanning:
			i := indexFF(b)
			if i < 0 {
				w.at += int64(len(b))
				b = nil
				if w.junk+(w.at-w.p) > maxMP3Junk {
					w.cut = w.p // the skip passes the bound wherever it ends
				}
				continue
			}
			w.scanning = false
			w.skipTo(w.at + int64(i))
			b, w.at = b[i:], w.at+int64(i)
		default:
			w.hdr[w.nh] = b[0]
			w.nh++
			b, w.at = b[1:], w.at+1
			if w.nh == 4 {
				w.header()
			}
		}
	}
}

// header reads the 4 bytes at p: a frame, or the start of a skip.
func (w *mp3Walk) header() {
	if n, us := mp3Frame(w.hdr[:]); n > 0 {
		w.micros += us
		w.p += int64(n)
		w.nh = 0
		return
	}
	// Not a frame: on to the next byte that may start one, which may be among the header's.
	for i := 1; i < 4; i++ {
		if w.hdr[i] == 0xff {
			if w.skipTo(w.p + int64(i)); w.cut < 0 {
				w.nh = copy(w.hdr[:], w.hdr[i:])
			}
			return
		}
	}
	w.nh, w.scanning = 0, true
}

// skipTo ends a skip from p at q, or cuts the walk where it began when the junk skipped
// passes maxMP3Junk.
func (w *mp3Walk) skipTo(q int64) {
	if w.junk += q - w.p; w.junk > maxMP3Junk {
		w.cut = w.p
		return
	}
	w.p = q
}

// end is the microseconds the stream plays, total being how long the data is said to decode
// to (DecodedLen of its characters), which times the rest of a cut walk.
func (w *mp3Walk) end(total int64) int64 {
	if w.cut < 0 && w.scanning && w.junk+(w.at-w.p) > maxMP3Junk {
		w.cut = w.p
	}
	if w.cut >= 0 {
		return w.micros + max(0, total-w.cut)*1_000_000/mp3LowestByteRate
	}
	return w.micros
}

func indexFF(b []byte) int {
	for i, c := range b {
		if c == 0xff {
			return i
		}
	}
	return -1
}
