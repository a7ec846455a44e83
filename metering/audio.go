package metering

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// estimateAudio guesses the audio part of a request's prompt: the clipTokens of each
// input_audio part of its chat messages or Responses input items (estimateInput counts them in
// the prompt too), and SentBackAnswerTokens for each earlier spoken answer a chat message
// sends back. The provider bills audio tokens at several times the text rate, so the gateway
// prices them apart, or refuses them on a model without an audio price: a part counts when its
// "type", the key compared with case folded as a provider decoding with Go's encoding/json
// reads it, is input_audio, or when it carries an input_audio payload. Three fixed levels:
// linear in the body. mayAudio is whether body may hold audio (mayHoldAudio).
func estimateAudio(f Format, body []byte, mayAudio bool) int64 {
	list := ""
	switch f {
	case FormatChat:
		list = "messages"
	case FormatResponses:
		list = "input"
	default:
		return 0
	}
	if !mayAudio {
		// Almost every request: no second parse (and copy) of the prompt on the hot path.
		return 0
	}
	items := gjson.GetBytes(body, list)
	var tokens int64
	items.ForEach(func(_, item gjson.Result) bool {
		item.ForEach(func(k, v gjson.Result) bool {
			switch {
			case strings.EqualFold(k.Str, "content") && v.IsArray():
				v.ForEach(func(_, part gjson.Result) bool {
					if isAudioPart(part) {
						tokens = min(maxEstimatedTokens, tokens+clipTokens(part))
					}
					return true
				})
			case f == FormatChat && strings.EqualFold(k.Str, "audio") && v.IsObject():
				// An earlier spoken answer sent back by its id ({"audio": {"id": …}} on an
				// assistant message): the model hears it again, billed as audio input. Its
				// length is not in the request.
				tokens = min(maxEstimatedTokens, tokens+SentBackAnswerTokens)
			}
			return true
		})
		return true
	})
	return tokens
}

// SentBackAnswerTokens is what an earlier spoken answer sent back by its id counts in both of
// EstimatePrompt's estimates: its length is not in the request. The
// gateway puts the tokens it recorded of that answer in its place when it has them.
const SentBackAnswerTokens = tokensPerMedia

// maxSentBack bounds the sent-back spoken answers whose recorded length a request looks up
// (a voice conversation sends back each of its answers; past this many, they count
// SentBackAnswerTokens each).
const maxSentBack = 64

// SpokenAnswersSentBack lists the ids of the earlier spoken answers a chat body sends back
// ({"audio": {"id": …}} on its messages), each one counted at SentBackAnswerTokens in the
// body's estimates; at most maxSentBack, each at most as long as a model name.
func SpokenAnswersSentBack(body []byte) []string {
	var ids []string
	gjson.GetBytes(body, "messages").ForEach(func(_, m gjson.Result) bool {
		m.ForEach(func(k, v gjson.Result) bool {
			if strings.EqualFold(k.Str, "audio") && v.IsObject() {
				if id := v.Get("id"); id.Type == gjson.String && id.Str != "" && len(id.Str) <= maxModelName {
					ids = append(ids, id.Str)
				}
			}
			return len(ids) < maxSentBack
		})
		return len(ids) < maxSentBack
	})
	return ids
}

// SpokenAnswerIDs lists the distinct ids of every spoken answer a chat body sends back, for the
// check of whose answers they are: SpokenAnswersSentBack stops at maxSentBack, and another
// user's answer sent back after 64 messages naming any other id was not checked. more is
// whether the body sends back more than limit distinct ids (the ids are then the first limit).
// An id longer than a model name is none, as it is to the Meter that records them; an id is
// under any key that is "id" with case folded.
func SpokenAnswerIDs(body []byte, limit int) (ids []string, more bool) {
	d := distinctIDs{limit: limit}
	gjson.GetBytes(body, "messages").ForEach(func(_, m gjson.Result) bool {
		m.ForEach(func(k, v gjson.Result) bool {
			if !strings.EqualFold(k.Str, "audio") || !v.IsObject() {
				return true
			}
			v.ForEach(d.add)
			return !d.more
		})
		return !d.more
	})
	return d.ids, d.more
}

// mayHoldAudio reports whether body could have an audio part or an earlier spoken answer:
// "input_audio", as a key in any case or as a value, holds "_audio" in ASCII case (no other
// rune folds to its letters), a spoken answer is an "audio" key, unless some character of
// either is written as a \u escape. Four fast byte scans. Only an escape of one of
// those characters counts: most prompts hold others (Go's encoding/json writes <, > and & as
// \u003c, \u003e, \u0026; Python's every non-ASCII character), and each sent every such prompt
// through a second full parse.
func mayHoldAudio(body []byte) bool {
	for b := body; ; {
		i := bytes.Index(b, []byte(`\u`))
		if i < 0 {
			break
		}
		b = b[i+2:]
		if len(b) < 4 {
			return true
		}
		r, ok := rune(0), true
		for _, h := range b[:4] {
			switch {
			case '0' <= h && h <= '9':
				r = r<<4 | rune(h-'0')
			case 'a' <= h && h <= 'f':
				r = r<<4 | rune(h-'a'+10)
			case 'A' <= h && h <= 'F':
				r = r<<4 | rune(h-'A'+10)
			default:
				ok = false
			}
		}
		if !ok || r == '_' || (r < utf8.RuneSelf && strings.ContainsRune("audioAUDIO", r)) {
			return true
		}
	}
	for b := body; ; {
		i := bytes.IndexByte(b, '_')
		if i < 0 {
			break
		}
		b = b[i+1:]
		if len(b) >= 5 && bytes.EqualFold(b[:5], []byte("audio")) {
			return true
		}
	}
	// An "audio" key (an earlier spoken answer sent back), in any case, found by its end: o"
	// is far rarer in a prompt than its quotes (a scan stopping at every quote took 110 µs
	// on a 100 KB conversation, this one 15).
	for _, end := range [][]byte{[]byte(`o"`), []byte(`O"`)} {
		for from := 0; ; {
			i := bytes.Index(body[from:], end)
			if i < 0 {
				break
			}
			j := from + i
			if j >= 5 && body[j-5] == '"' && bytes.EqualFold(body[j-4:j], []byte("audi")) {
				return true
			}
			from = j + 2
		}
	}
	return false
}

// isAudioPart reports whether a content part is audio input.
func isAudioPart(part gjson.Result) bool {
	if !part.IsObject() {
		return false
	}
	audio := false
	part.ForEach(func(k, v gjson.Result) bool {
		audio = strings.EqualFold(k.Str, "input_audio") || (strings.EqualFold(k.Str, "type") && v.Str == "input_audio")
		return !audio
	})
	return audio
}

// audioTokensPerSecond is how many tokens a second of audio counts at OpenAI (one per 100 ms).
const audioTokensPerSecond = 10

// clipTokens estimates an audio part's tokens from its length: a WAV header's format gives the
// duration of the base64 data, an MP3 stream's frames theirs. A clip whose length cannot be read
// so counts tokensPerMedia. Flat, a long clip was estimated at a fraction of what the provider
// bills for it (13 minutes of 32 kbps speech fit a 4 MiB body: ~7 900 tokens), and a caller
// who left before the usage report paid that fraction.
func clipTokens(part gjson.Result) int64 {
	data := ""
	part.ForEach(func(k, payload gjson.Result) bool {
		if strings.EqualFold(k.Str, "input_audio") {
			payload.ForEach(func(k, v gjson.Result) bool {
				if strings.EqualFold(k.Str, "data") && v.Type == gjson.String {
					data = v.Str
				}
				return true
			})
		}
		return true
	})
	micros := clipMicros(data)
	if micros <= 0 {
		return tokensPerMedia
	}
	return max(1, ceilDiv(micros*audioTokensPerSecond, 1_000_000))
}

// clipMicros is how long the base64 audio data plays, in microseconds: a WAV file's data size
// over its rate, or the frames of an MP3 stream (after an ID3v2 tag); 0 when it is neither.
func clipMicros(data string) int64 {
	kind, rate, off := clipHead(data)
	switch kind {
	case clipWAV:
		return wavMicros(int64(len(data)), rate)
	case clipMP3:
		return mp3Micros(data, off)
	}
	return 0
}

// clipHead reads what file base64 audio data holds from its first bytes: a WAV file and its
// byte rate, or an MP3 stream and where its frames start (after an ID3v2 tag); clipNone when
// it cannot be timed so. It reads at most the data's first 52 characters.
func clipHead(data string) (kind clipKind, rate, off int64) {
	head, ok := decodeBase64At(data, 0, 36)
	if !ok || len(head) < 10 {
		return clipNone, 0, 0
	}
	if string(head[0:4]) == "RIFF" && len(head) >= 36 && string(head[8:16]) == "WAVEfmt " {
		// A decoder times the clip by its sample rate, channels and sample width; the byte
		// rate is a hint the caller writes, and one claimed huge made a long clip one token.
		rate = int64(binary.LittleEndian.Uint32(head[28:32]))
		samples := int64(binary.LittleEndian.Uint32(head[24:28])) * int64(binary.LittleEndian.Uint16(head[22:24]))
		if pcm := samples * ((int64(binary.LittleEndian.Uint16(head[34:36])) + 7) / 8); pcm > 0 {
			rate = min(rate, pcm)
		}
		if rate <= 0 {
			return clipNone, 0, 0
		}
		return clipWAV, rate, 0
	}
	if string(head[0:3]) == "ID3" {
		// A syncsafe size: 7 bits per byte; a footer adds 10 bytes.
		off = 10 + (int64(head[6]&0x7f)<<21 | int64(head[7]&0x7f)<<14 | int64(head[8]&0x7f)<<7 | int64(head[9]&0x7f))
		if head[5]&0x10 != 0 {
			off += 10
		}
	}
	return clipMP3, 0, off
}

// wavMicros is how long n characters of base64 WAV data play at rate bytes a second.
func wavMicros(n, rate int64) int64 {
	return int64(base64.StdEncoding.DecodedLen(int(n))) * 1_000_000 / rate
}

// mp3Micros walks the MPEG audio Layer III frames of the base64 data from byte off and returns
// the microseconds they play: every frame, as a decoder plays them, resynchronising past bytes
// that are not one (mp3Walk). Timed by its first frame alone, a variable-rate stream whose
// first frame claims 320 kbit/s was estimated at a tenth of its 32 kbit/s rest. Linear in the
// data; the walk is the one an answer too large to hold is timed by as it goes by
// (UnrelayedAnswer), so that both time the same data alike.
func mp3Micros(data string, off int64) int64 {
	w := newMP3Walk(off)
	var dec base64Stream
	dec.write(data, w.push)
	dec.flush(w.push)
	return w.end(int64(base64.StdEncoding.DecodedLen(len(data))))
}

// maxMP3Junk bounds the bytes an MP3 walk resynchronises past; mp3LowestByteRate is the
// slowest a Layer III stream plays its bytes (8 kbit/s).
const (
	maxMP3Junk        = 64 << 10
	mp3LowestByteRate = 1000
)

// mp3Frame reads a Layer III frame header: the frame's length in bytes and the microseconds it
// plays; 0, 0 when h does not start one.
func mp3Frame(h []byte) (n int, micros int64) {
	if h[0] != 0xff || h[1]&0xe0 != 0xe0 || (h[1]>>1)&3 != 1 {
		return 0, 0
	}
	kbps, rates, samples, perKbps := mp3KbpsMPEG2[h[2]>>4], [3]int64{22050, 24000, 16000}, int64(576), int64(72)
	switch (h[1] >> 3) & 3 {
	case 3: // MPEG-1
		kbps, rates, samples, perKbps = mp3KbpsMPEG1[h[2]>>4], [3]int64{44100, 48000, 32000}, 1152, 144
	case 1: // reserved
		return 0, 0
	case 0: // MPEG-2.5
		rates = [3]int64{11025, 12000, 8000}
	}
	ri := (h[2] >> 2) & 3
	if kbps == 0 || ri == 3 {
		return 0, 0
	}
	rate := rates[ri]
	return int(perKbps*kbps*1000/rate) + int((h[2]>>1)&1), samples * 1_000_000 / rate
}

// Layer III bit rates (kbit/s) by the frame header's index; 0: free or bad.
var (
	mp3KbpsMPEG1 = [16]int64{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0}
	mp3KbpsMPEG2 = [16]int64{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 0} // and 2.5
)

// decodeBase64At decodes up to n bytes of the standard base64 data from byte offset off,
// reading only the characters it needs.
func decodeBase64At(data string, off int64, n int) ([]byte, bool) {
	start := off / 3 * 4
	if off < 0 || start >= int64(len(data)) {
		return nil, false
	}
	end := min(int64(len(data)), start+int64(n+5)/3*4)
	out, err := base64.StdEncoding.DecodeString(data[start:end])
	if err != nil {
		return nil, false
	}
	if int64(len(out)) < off%3 {
		return nil, false
	}
	out = out[off%3:]
	return out[:min(len(out), n)], true
}

// audioOutputTokensPerSecond is how many tokens a second of a spoken answer counts at OpenAI,
// twice an audio prompt's: its Realtime launch priced audio output at 200 USD per million
// tokens and about 0.24 USD a minute (1 200 tokens a minute), audio input at 100 USD and 0.06
// USD a minute (600, the ten a second of audioTokensPerSecond).
const audioOutputTokensPerSecond = 20

// pcmBytesPerSecond is the rate of the raw audio OpenAI streams: 16-bit samples, 24 kHz, mono.
const pcmBytesPerSecond = 2 * 24_000

// spokenAnswer counts a chat answer's audio object (choices[].delta.audio in a stream,
// choices[].message.audio in a whole body): its transcript is text the model wrote, its data
// audio it spoke. A stream's data is raw PCM, whose length is its duration; a whole answer's
// is a file in the format asked for, timed as an audio prompt's clips are (WAV, MP3), or
// counted as raw PCM when it is neither (pcm16; FLAC, Opus and AAC files play longer than that).
func (m *Meter) spokenAnswer(audio gjson.Result, streamed bool) {
	audio.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			m.sawSpokenID(v)
		case "transcript":
			m.res.OutputChars += strLen(v)
		case "data":
			if v.Type != gjson.String {
				return true
			}
			if !streamed && isClipFile(v.Str) {
				if us := clipMicros(v.Str); us > 0 {
					m.clipMicros = min(m.clipMicros+us, maxAudioCount)
					return true
				}
			}
			m.pcmBytes = min(m.pcmBytes+base64Len(v.Str), maxAudioCount)
		}
		return true
	})
}

// maxSpokenIDs bounds the spoken answers' ids a Meter keeps: one a choice, and a call asks for
// at most 128 choices.
const maxSpokenIDs = 128

// sawSpokenID keeps a spoken answer's id (a copy: the event's memory is reused), once: a
// stream may repeat it in each of its audio deltas. Longer than maxModelName is no id.
func (m *Meter) sawSpokenID(v gjson.Result) {
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > maxModelName || len(m.res.SpokenIDs) >= maxSpokenIDs {
		return
	}
	for _, id := range m.res.SpokenIDs {
		if id == v.Str {
			return
		}
	}
	m.res.SpokenIDs = append(m.res.SpokenIDs, strings.Clone(v.Str))
}

// isClipFile reports whether base64 audio data starts as a file clipMicros can time: a WAV
// header, an ID3v2 tag or two MPEG Layer III frames in a row. Raw PCM (pcm16) is none of
// these (its first frame-like header is followed by no second one): handed
// to clipMicros it was walked as an MP3 whose bytes are not frames, and past 64 KiB timed at
// 8 kbit/s, 48 times longer than it plays at 24 kHz 16-bit (any 0xff byte followed by a
// frame-like one counted besides).
func isClipFile(data string) bool {
	head, ok := decodeBase64At(data, 0, 12)
	if !ok || len(head) < 4 {
		return false
	}
	if len(head) >= 12 && string(head[0:4]) == "RIFF" && string(head[8:12]) == "WAVE" {
		return true
	}
	if string(head[0:3]) == "ID3" {
		return true
	}
	// Raw PCM is any bytes, its first four a frame header now and then (a first sample of
	// 0xFBFF, -1 025, and a second whose low byte is a bit rate): a stream is one only when
	// the frame it starts with is followed by another, as a decoder syncs.
	n, _ := mp3Frame(head[:4])
	if n == 0 {
		return false
	}
	next, ok := decodeBase64At(data, int64(n), 4)
	if !ok || len(next) < 4 {
		// A single frame is too short to tell; as PCM it is a tenth of a second or less.
		return false
	}
	m, _ := mp3Frame(next)
	return m > 0
}

// maxAudioCount bounds an answer's audio counts (bytes, microseconds) far above any real one
// (a TiB; 13 days), so that audioOutputTokens cannot overflow on hostile figures.
const maxAudioCount = 1 << 40

// audioOutputTokens estimates a spoken answer's tokens from its raw PCM bytes and its files'
// duration: 20 a second, rounded up.
func audioOutputTokens(pcmBytes, clipMicros int64) int64 {
	if pcmBytes == 0 && clipMicros == 0 {
		return 0
	}
	micros := pcmBytes*1_000_000/pcmBytesPerSecond + clipMicros
	return min(maxEstimatedTokens, ceilDiv(micros*audioOutputTokensPerSecond, 1_000_000))
}

// base64Len is how many bytes the standard base64 text s decodes to (its padding left out).
func base64Len(s string) int64 {
	n := int64(len(s)) * 3 / 4
	for i := len(s) - 1; i >= 0 && i >= len(s)-2 && s[i] == '='; i-- {
		n--
	}
	return max(0, n)
}
