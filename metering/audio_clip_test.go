package metering

import (
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

// mp3Clip is an MP3 stream of seconds of audio whose frames say kbps (header bytes b1, b2),
// after an ID3v2 tag of tagSize bytes when tagSize > 0, base64.
func mp3Clip(b1, b2 byte, kbps, seconds, tagSize int) string {
	var b []byte
	if tagSize > 0 {
		b = append(b, 'I', 'D', '3', 4, 0, 0,
			byte(tagSize>>21&0x7f), byte(tagSize>>14&0x7f), byte(tagSize>>7&0x7f), byte(tagSize&0x7f))
		b = append(b, make([]byte, tagSize)...)
	}
	b = append(b, 0xff, b1, b2, 0x00)
	b = append(b, make([]byte, kbps*1000/8*seconds-4)...)
	return base64.StdEncoding.EncodeToString(b)
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
		{"mp3 MPEG-1 128 kbps, 60 s", "mp3", mp3Clip(0xfb, 0x90, 128, 60, 0), 600},
		{"mp3 MPEG-2 32 kbps, 780 s, behind an ID3 tag", "mp3", mp3Clip(0xf3, 0x40, 32, 780, 5_000), 7_800},
		{"mp3 MPEG-2.5 8 kbps, 60 s", "mp3", mp3Clip(0xe3, 0x10, 8, 60, 0), 600},
		{"unreadable", "mp3", base64.StdEncoding.EncodeToString([]byte("not audio at all, not a header")), tokensPerMedia},
		{"not base64", "wav", "%%%%", tokensPerMedia},
		{"empty", "wav", "", tokensPerMedia},
	} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":%q}}]}]}`,
			tc.data, tc.format)
		got := EstimateAudioInputTokens(FormatChat, []byte(body))
		// The WAV header's 44 bytes round the estimate up by at most one token.
		if got != tc.want && got != tc.want+1 {
			t.Errorf("%s: %d tokens, want %d", tc.name, got, tc.want)
		}
		if in := EstimateInputTokens(FormatChat, []byte(body)); in < got {
			t.Errorf("%s: the prompt's estimate %d is less than its audio's %d", tc.name, in, got)
		}
	}
}

// TestAudioClipEstimateNotTakenFromAForgedByteRate: a decoder times a WAV clip by its sample
// rate, channels and sample width; the header's byte rate is only a hint, which the caller
// writes. A 300 s clip of 8 kHz 8-bit mono whose byte rate says 4 GB/s was estimated at one
// token, where the provider bills 3 000: a caller who left before the usage report paid one.
func TestAudioClipEstimateNotTakenFromAForgedByteRate(t *testing.T) {
	h := make([]byte, 44+8_000*300)
	copy(h, "RIFF")
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)          // PCM
	binary.LittleEndian.PutUint16(h[22:], 1)          // mono
	binary.LittleEndian.PutUint32(h[24:], 8_000)      // 8 kHz
	binary.LittleEndian.PutUint32(h[28:], 0xffffffff) // the forged byte rate
	binary.LittleEndian.PutUint16(h[32:], 1)          // block align
	binary.LittleEndian.PutUint16(h[34:], 8)          // 8-bit
	copy(h[36:], "data")
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}}]}]}`,
		base64.StdEncoding.EncodeToString(h))
	if got := EstimateAudioInputTokens(FormatChat, []byte(body)); got < 3_000 {
		t.Errorf("a 300 s clip whose header claims a huge byte rate: %d tokens, want 3 000", got)
	}
	if in := EstimateInputTokens(FormatChat, []byte(body)); in < 3_000 {
		t.Errorf("its prompt's estimate: %d tokens, want at least 3 000", in)
	}
}
