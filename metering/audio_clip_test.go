package metering

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"testing"
)

// wavClip is a WAV file of seconds of audio at byteRate bytes per second, base64.
func wavClip(byteRate, seconds int) string {
	h := make([]byte, 44, 44+byteRate*seconds)
	copy(h, "RIFF")
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint32(h[28:], uint32(byteRate))
	copy(h[36:], "data")
	return base64.StdEncoding.EncodeToString(h[:44+byteRate*seconds])
}

// mp3Layer3 is one kind of MPEG audio Layer III frame: the header's second byte (version,
// layer, no CRC), its bit rate index and kbit/s, and its sample rate (index 0 of its version).
type mp3Layer3 struct {
	b1, index            byte
	kbps, rate, perFrame int // perFrame: samples per frame
}

var (
	mpeg1  = func(index byte, kbps int) mp3Layer3 { return mp3Layer3{0xfb, index, kbps, 44_100, 1152} }
	mpeg2  = func(index byte, kbps int) mp3Layer3 { return mp3Layer3{0xf3, index, kbps, 22_050, 576} }
	mpeg25 = func(index byte, kbps int) mp3Layer3 { return mp3Layer3{0xe3, index, kbps, 11_025, 576} }
)

// frames is seconds of audio in frames of kind k (a frame holds perFrame samples and
// perFrame/8 × kbps × 1000 / rate bytes, its header first).
func (k mp3Layer3) frames(seconds int) []byte {
	size := k.perFrame / 8 * k.kbps * 1000 / k.rate
	n := (seconds*k.rate + k.perFrame - 1) / k.perFrame
	out := make([]byte, 0, n*size)
	for range n {
		f := make([]byte, size)
		copy(f, []byte{0xff, k.b1, k.index << 4, 0})
		out = append(out, f...)
	}
	return out
}

// frame is one frame of kind k.
func (k mp3Layer3) frame() []byte { return k.frames(1)[:k.perFrame/8*k.kbps*1000/k.rate] }

// id3 is an ID3v2 tag of size bytes after its header.
func id3(size int) []byte {
	b := []byte{'I', 'D', '3', 4, 0, 0, byte(size >> 21 & 0x7f), byte(size >> 14 & 0x7f), byte(size >> 7 & 0x7f), byte(size & 0x7f)}
	return append(b, make([]byte, size)...)
}

func b64(parts ...[]byte) string {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	return base64.StdEncoding.EncodeToString(all)
}

// TestAudioClipEstimateFollowsItsLength: a clip counts ten tokens a second of its audio, read
// from its WAV header or its first MP3 frame. At a flat 1 600 tokens, 13 minutes of 32 kbps
// speech (which a 4 MiB body holds) was estimated at a fifth of what the provider bills, and
// a caller who left before the usage report paid that fifth.
func TestAudioClipEstimateFollowsItsLength(t *testing.T) {
	for _, tc := range []struct {
		name, format, data string
		want               int64
	}{
		{"wav 16 kHz 16-bit, 60 s", "wav", wavClip(32_000, 60), 600},
		{"wav 8 kHz 8-bit, 300 s", "wav", wavClip(8_000, 300), 3_000},
		{"mp3 MPEG-1 128 kbps, 60 s", "mp3", b64(mpeg1(9, 128).frames(60)), 600},
		{"mp3 MPEG-2 32 kbps, 780 s, behind an ID3 tag", "mp3", b64(id3(5_000), mpeg2(4, 32).frames(780)), 7_800},
		{"mp3 MPEG-2.5 8 kbps, 60 s", "mp3", b64(mpeg25(1, 8).frames(60)), 600},
		// Variable rate: a first frame at 320 kbit/s does not make the 32 kbit/s rest shorter.
		{"mp3 first frame 320 kbps, then 60 s at 32", "mp3", b64(mpeg1(14, 320).frame(), mpeg1(1, 32).frames(60)), 600},
		// A decoder resynchronises past bytes that are not a frame, and plays what follows.
		{"mp3 30 s, junk, 30 s", "mp3", b64(mpeg1(1, 32).frames(30), bytes.Repeat([]byte{0xff, 0x00, 0x12}, 3000), mpeg1(1, 32).frames(30)), 600},
		// A header whose bit rate index is free (0) or bad (15) is no frame a decoder plays,
		// padding bit or not: junk, not a frame one byte long playing 26 ms.
		{"mp3 10 s, then free-format headers", "mp3", b64(mpeg1(1, 32).frames(10), bytes.Repeat([]byte{0xff, 0xfb, 0x02, 0x00}, 10_000)), 100},
		{"mp3 10 s, then bad-rate headers", "mp3", b64(mpeg1(1, 32).frames(10), bytes.Repeat([]byte{0xff, 0xfb, 0xf2, 0x00}, 10_000)), 100},
		{"unreadable", "mp3", base64.StdEncoding.EncodeToString([]byte("not audio at all, not a header")), tokensPerMedia},
		{"not base64", "wav", "%%%%", tokensPerMedia},
		// A WAV header whose rates are all 0, and an ID3 tag cut short of its 10-byte header,
		// say no length: the clip counts flat.
		{"wav of rate 0", "wav", wavClip(0, 0), tokensPerMedia},
		{"ID3 tag cut short", "mp3", b64([]byte("ID3\x04\x00\x00\x00")), tokensPerMedia},
		// A RIFF WAVE header cut short of its format's 36 bytes holds no rate to time it by.
		{"wav header cut short", "wav", b64([]byte("RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00")), tokensPerMedia},
		{"empty", "wav", "", tokensPerMedia},
	} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":%q}}]}]}`,
			tc.data, tc.format)
		got := EstimateAudioInputTokens(FormatChat, []byte(body))
		// The WAV header's 44 bytes, or the frames' rounding, add at most two tokens.
		if got < tc.want || got > tc.want+2 {
			t.Errorf("%s: %d tokens, want %d", tc.name, got, tc.want)
		}
		if in := EstimateInputTokens(FormatChat, []byte(body)); in < got {
			t.Errorf("%s: the prompt's estimate %d is less than its audio's %d", tc.name, in, got)
		}
	}
}

// TestAudioClipDataUnderAnyKeyCaseIsTimed: the provider decodes a part with Go's
// encoding/json, which matches "input_audio" and "data" with case folded: a 60 s clip under
// "Input_Audio" and "Data" plays 60 s (600 tokens). Mutant: "data" matched exactly, the clip
// unread and counted flat (1 600 tokens, less than a clip past 160 s plays).
func TestAudioClipDataUnderAnyKeyCaseIsTimed(t *testing.T) {
	for _, keys := range [][2]string{{"input_audio", "data"}, {"Input_Audio", "Data"}, {"input_audio", "DATA"}} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","%s":{"%s":%q,"format":"wav"}}]}]}`,
			keys[0], keys[1], wavClip(32_000, 60))
		if got := EstimateAudioInputTokens(FormatChat, []byte(body)); got < 600 || got > 602 {
			t.Errorf("60 s clip under %q and %q: %d tokens, want 600", keys[0], keys[1], got)
		}
	}
}

// TestAudioClipEstimateNotTakenFromAForgedByteRate: a decoder times a WAV clip by its sample
// rate, channels and sample width; the header's byte rate is only a hint, which the caller
// writes. A 300 s clip of 8 kHz 8-bit mono whose byte rate says 4 GB/s was estimated at one
// token, where the provider bills 3 000: a caller who left before the usage report paid one.
//
// A sample narrower than a byte (4-bit ADPCM) is timed as a whole byte: at most as long as it
// plays, never by the forged rate. Mutant: the width rounded down, a 4-bit sample zero bytes
// wide, the forged rate taken (one token).
func TestAudioClipEstimateNotTakenFromAForgedByteRate(t *testing.T) {
	for _, bits := range []uint16{8, 4} {
		h := make([]byte, 44+8_000*300)
		copy(h, "RIFF")
		copy(h[8:], "WAVEfmt ")
		binary.LittleEndian.PutUint32(h[16:], 16)
		binary.LittleEndian.PutUint16(h[20:], 1)          // PCM
		binary.LittleEndian.PutUint16(h[22:], 1)          // mono
		binary.LittleEndian.PutUint32(h[24:], 8_000)      // 8 kHz
		binary.LittleEndian.PutUint32(h[28:], 0xffffffff) // the forged byte rate
		binary.LittleEndian.PutUint16(h[32:], 1)          // block align
		binary.LittleEndian.PutUint16(h[34:], bits)       // sample width
		copy(h[36:], "data")
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}}]}]}`,
			base64.StdEncoding.EncodeToString(h))
		if got := EstimateAudioInputTokens(FormatChat, []byte(body)); got < 3_000 {
			t.Errorf("%d-bit: a clip of 2.4 MB at 8 kHz whose header claims a huge byte rate: %d tokens, want 3 000", bits, got)
		}
		if in := EstimateInputTokens(FormatChat, []byte(body)); in < 3_000 {
			t.Errorf("%d-bit: its prompt's estimate: %d tokens, want at least 3 000", bits, in)
		}
	}
}

// TestAudioClipWalkBounded: bytes crafted so that a walk resynchronises at every other one
// (a step per two bytes of a 4 MiB body, before any hold) are walked only so far; the rest is
// timed at the lowest bit rate (8 kbit/s: 1 000 bytes a second), never less than a decoder
// could play from them.
func TestAudioClipWalkBounded(t *testing.T) {
	junk := bytes.Repeat([]byte{0xff, 0x00}, 1_000_000) // 2 MB
	got := clipMicros(b64(mpeg1(1, 32).frames(10), junk))
	// Past the junk walked (played as nothing), the rest at the lowest rate.
	if want := int64(10_000_000 + (2_000_000-maxMP3Junk)*1_000); got < want {
		t.Fatalf("%d µs, want at least %d: the junk past the walk timed at the lowest rate", got, want)
	}
}

func BenchmarkAudioClipJunk(b *testing.B) {
	data := b64(bytes.Repeat([]byte{0xff, 0x00}, 1_500_000))
	for b.Loop() {
		clipMicros(data)
	}
}
