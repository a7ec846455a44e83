package metering

import (
	"bytes"
	"unicode/utf8"
)

// An UnrelayedAnswer's bytes inside strings: escapes, and the text counted.

// stringByte reads a byte of a string: its end, an escape, or a byte of its text.
func (b *UnrelayedAnswer) stringByte(c byte) {
	if b.high != 0 && b.esc == 0 && c != '\\' {
		b.lone() // a high surrogate no \u follows
	}
	switch {
	case b.esc == 1:
		b.esc = 0
		if c == 'u' {
			b.esc, b.hex = 2, 0
			return
		}
		if b.high != 0 {
			b.lone()
		}
		switch c {
		case 'b':
			b.text('\b')
		case 'f':
			b.text('\f')
		case 'n':
			b.text('\n')
		case 'r':
			b.text('\r')
		case 't':
			b.text('\t')
		default: // ", \ and /
			b.text(c)
		}
	case b.esc >= 2:
		switch {
		case '0' <= c && c <= '9':
			b.hex = b.hex<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			b.hex = b.hex<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			b.hex = b.hex<<4 | rune(c-'A'+10)
		}
		if b.esc++; b.esc == 6 {
			b.esc = 0
			b.escapedRune(b.hex)
		}
	case c == '\\':
		b.esc = 1
	case c == '"':
		b.inString, b.counting, b.holding, b.reasoning, b.echoing, b.own = false, false, false, roleNone, false, false
		if b.typing {
			b.typing = false
			if f := b.top(); f != nil && b.typLen == len(b.typ) && string(b.typ[:]) == compactionType {
				f.kind = kindCompaction
				b.textBytes += f.held
			}
		}
		if b.raw == rawString {
			b.rawEnds(b.at + 1)
		}
		if b.isKey {
			b.keyEnds()
		} else if b.data != nil {
			pcm, us := b.data.measure()
			b.pcmBytes = min(b.pcmBytes+pcm, maxAudioCount)
			b.clipMicros = min(b.clipMicros+us, maxAudioCount)
			b.data = nil
		}
	default:
		b.text(c)
	}
}

// plainRun is how many bytes of p, a string's text, come before its end or an escape.
func plainRun(p []byte) int {
	end := bytes.IndexByte(p, '"')
	if end < 0 {
		end = len(p)
	}
	if esc := bytes.IndexByte(p[:end], '\\'); esc >= 0 {
		return esc
	}
	return end
}

// escapedRune adds a \u escape's rune, pairing surrogates as gjson does: a high one waits for
// the low one that may follow it; alone, either is U+FFFD.
func (b *UnrelayedAnswer) escapedRune(r rune) {
	if b.high != 0 {
		h := b.high
		b.high = 0
		if 0xDC00 <= r && r < 0xE000 {
			b.runeText(0x10000 + (h-0xD800)<<10 + (r - 0xDC00))
			return
		}
		b.runeText(utf8.RuneError)
	}
	if 0xD800 <= r && r < 0xDC00 {
		b.high = r
		return
	}
	b.runeText(r)
}

// lone adds a high surrogate that no low one followed.
func (b *UnrelayedAnswer) lone() {
	b.high = 0
	b.runeText(utf8.RuneError)
}

func (b *UnrelayedAnswer) runeText(r rune) {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	for _, c := range buf[:n] {
		b.text(c)
	}
}

// text adds one byte of a string's text to the key or the audio data being read.
func (b *UnrelayedAnswer) text(c byte) {
	switch {
	case b.isKey:
		if b.keyLen < answerKeyLen {
			b.key[b.keyLen] = c
		}
		b.keyLen = min(b.keyLen+1, answerKeyLen+1)
	case b.data != nil:
		one := [1]byte{c}
		b.data.write(string(one[:]))
	case b.counting:
		one := [1]byte{c}
		b.countText(one[:])
	case b.typing:
		b.typeByte(c)
	}
}

// countText counts s, the next bytes of the text being read; of a choice's text that may
// begin with its echo, it keeps the bytes that may be echo for echoEnds to match.
func (b *UnrelayedAnswer) countText(s []byte) {
	if b.echoing {
		b.choice.textBytes += int64(len(s))
		if room := b.echoLen - len(b.echoText); room > 0 {
			b.echoText = append(b.echoText, s[:min(len(s), room)]...)
		}
	}
	b.count(int64(len(s)))
}

// count adds n bytes of text: to the answer's, or held in the innermost frame, a block whose
// type is not read yet.
func (b *UnrelayedAnswer) count(n int64) {
	f := b.top()
	if b.holding && f != nil {
		f.held += n
		return
	}
	if b.own {
		b.element.ownText += n // text once the answer is known to be in the server's own shape
		return
	}
	b.textBytes += n
	switch {
	case f == nil:
	case b.reasoning == roleReasoningContent:
		f.reasoningContent += n
	case b.reasoning == roleReasoning:
		f.reasoning += n
	}
}

// reasoningOnce takes back, for the message f closes (or the answer is cut inside of), the
// smaller of its reasoning_content and its reasoning: the same text under both names counts
// once (openAIChoices).
func (b *UnrelayedAnswer) reasoningOnce(f *answerFrame) {
	if f != nil && f.role == roleMessage {
		b.textBytes -= min(f.reasoningContent, f.reasoning)
		f.reasoningContent, f.reasoning = 0, 0
	}
}

// typeByte gathers one byte of a block's type.
func (b *UnrelayedAnswer) typeByte(c byte) {
	if b.typLen < len(b.typ) {
		b.typ[b.typLen] = c
	}
	b.typLen = min(b.typLen+1, len(b.typ)+1)
}
