package metering

import (
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
)

// TestMeterSpokenAnswerRawPCMWhole: a whole answer asked for in pcm16 carries raw 24 kHz 16-bit
// PCM, neither WAV nor MP3: it plays its bytes over 48 000 a second, 20 tokens a second. Handed
// to the MP3 walk, past 64 KiB its bytes were timed at 8 kbit/s: 10 seconds billed as 8 293
// audio tokens instead of 200.
func TestMeterSpokenAnswerRawPCMWhole(t *testing.T) {
	for _, secs := range []int{1, 2, 10} {
		pcm := make([]byte, secs*pcmBytesPerSecond)
		for i := range pcm {
			pcm[i] = byte(i * 7) // not silence
		}
		m := NewMeter(FormatChat)
		m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
			base64.StdEncoding.EncodeToString(pcm) + `","transcript":"Hi."}}}]}`))
		if got, want := m.Result().AudioOutput, int64(secs*audioOutputTokensPerSecond); got != want {
			t.Errorf("%d s of raw PCM in a whole answer: %d audio tokens, want %d", secs, got, want)
		}
	}
}

// TestEstimateCountsSpokenAnswerSentBesideText: an earlier spoken answer sent back is heard
// again beside the conversation's text: the prompt's estimate is its text and 1 600 tokens
// more (the audio part EstimateAudioInputTokens gives), as README says, not the larger of the
// two (the proxy prices promptEstimate's Input at max(text, audio), its AudioInput part at the
// audio price: 1 600 of the text's tokens were billed as the audio, and the audio's own
// tokens not at all).
func TestEstimateCountsSpokenAnswerSentBesideText(t *testing.T) {
	text := strings.Repeat("x", 40_000)
	for _, key := range []string{"audio", "Audio"} {
		with := `{"model":"m","messages":[{"role":"user","content":"` + text + `"},{"role":"assistant","` + key + `":{"id":"audio_1"}},{"role":"user","content":"again"}]}`
		without := `{"model":"m","messages":[{"role":"user","content":"` + text + `"},{"role":"assistant"},{"role":"user","content":"again"}]}`
		if audio := EstimateAudioInputTokens(FormatChat, []byte(with)); audio != tokensPerMedia {
			t.Fatalf("%s: audio estimate %d, want %d", key, audio, tokensPerMedia)
		}
		got, base := EstimateInputTokens(FormatChat, []byte(with)), EstimateInputTokens(FormatChat, []byte(without))
		if got != base+tokensPerMedia {
			t.Errorf("%s: prompt estimate %d, want the text's %d and the answer's %d", key, got, base, tokensPerMedia)
		}
	}
	// A null audio (an SDK's echo of a text answer) is no audio.
	null := `{"model":"m","messages":[{"role":"assistant","content":"hi","audio":null}]}`
	if got, want := EstimateInputTokens(FormatChat, []byte(null)), EstimateInputTokens(FormatChat, []byte(`{"model":"m","messages":[{"role":"assistant","content":"hi"}]}`)); got != want {
		t.Errorf("null audio: %d, want %d", got, want)
	}
}

// TestMeterSpokenAnswerReportWithoutAudioDetail: a usage report without
// completion_tokens_details (a compatible provider that leaves it out) for an answer that
// spoke bills the audio heard, up to the output reported, as audio; one that says
// audio_tokens 0 is taken at its word.
func TestMeterSpokenAnswerReportWithoutAudioDetail(t *testing.T) {
	second := base64.StdEncoding.EncodeToString(make([]byte, pcmBytesPerSecond))
	spoke := data(`{"choices":[{"delta":{"audio":{"data":"` + second + `"}}}]}`)
	for _, tc := range []struct {
		name  string
		usage string
		want  int64
	}{
		{"no details", `{"prompt_tokens":5,"completion_tokens":30}`, 20},
		{"fewer output tokens than heard", `{"prompt_tokens":5,"completion_tokens":12}`, 12},
		{"details say none", `{"prompt_tokens":5,"completion_tokens":30,"completion_tokens_details":{"audio_tokens":0}}`, 0},
		{"details say some", `{"prompt_tokens":5,"completion_tokens":30,"completion_tokens_details":{"audio_tokens":25}}`, 25},
	} {
		r := meterEvents(FormatChat, spoke, data(`{"choices":[],"usage":`+tc.usage+`}`))
		if !r.Reported || r.Usage.AudioOutput != tc.want {
			t.Errorf("%s: %+v, want %d audio output tokens", tc.name, r.Usage, tc.want)
		}
		// Billed from the audio heard, the settlement is an estimate (estimated=1), as an
		// Anthropic stream cut before its final count is; from the report's detail it is not.
		if heard := !strings.Contains(tc.usage, "audio_tokens"); r.Estimated != heard {
			t.Errorf("%s: estimated %v, want %v", tc.name, r.Estimated, heard)
		}
	}
}

// TestEstimatePromptIsBothEstimates: the proxy takes both estimates from EstimatePrompt, which
// looks for audio once; it must say what the two functions say apart.
func TestEstimatePromptIsBothEstimates(t *testing.T) {
	for _, tc := range []struct {
		f    Format
		body string
	}{
		{FormatChat, `{"messages":[{"role":"user","content":"hello"}]}`},
		{FormatChat, `{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA","format":"wav"}}]}]}`},
		{FormatChat, `{"messages":[{"role":"assistant","Audio":{"id":"audio_1"}},{"role":"user","content":"again"}]}`},
		{FormatResponses, `{"input":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA"}}]}]}`},
		{FormatAnthropic, `{"messages":[{"role":"user","content":"audio"}],"max_tokens":5}`},
		{FormatEmbeddings, `{"input":["a","b"]}`},
	} {
		in, audio := EstimatePrompt(tc.f, []byte(tc.body))
		if wantIn, wantAudio := EstimateInputTokens(tc.f, []byte(tc.body)), EstimateAudioInputTokens(tc.f, []byte(tc.body)); in != wantIn || audio != wantAudio {
			t.Errorf("%s: EstimatePrompt = %d, %d, want %d, %d", tc.body, in, audio, wantIn, wantAudio)
		}
	}
}

// TestMeterSpokenAnswerRawPCMStartingLikeAFrame: raw PCM is any bytes; a pcm16 answer whose
// first sample reads 0xFBFF (-1 025) followed by one whose low byte is a valid bit rate starts
// like an MPEG-1 Layer III frame header. Taken for an MP3 on those four bytes, it was walked
// as frames of junk and past 64 KiB timed at 8 kbit/s: 10 s billed as ~9 600 audio tokens
// instead of 200. A file is one only when its first frame is followed by another.
func TestMeterSpokenAnswerRawPCMStartingLikeAFrame(t *testing.T) {
	const secs = 10
	pcm := make([]byte, secs*pcmBytesPerSecond)
	for i := range pcm {
		pcm[i] = byte(i * 7)
	}
	copy(pcm, []byte{0xff, 0xfb, 0x90, 0x64}) // MPEG-1 Layer III, 128 kbit/s, 44.1 kHz
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
		base64.StdEncoding.EncodeToString(pcm) + `","transcript":"Hi."}}}]}`))
	if got, want := m.Result().AudioOutput, int64(secs*audioOutputTokensPerSecond); got != want {
		t.Errorf("%d s of raw PCM whose first bytes look like a frame header: %d audio tokens, want %d", secs, got, want)
	}
	// A real MP3 (two frames in a row) is still timed by its frames.
	frame := make([]byte, 417) // 128 kbit/s at 44.1 kHz, no padding: 26 122 µs
	copy(frame, []byte{0xff, 0xfb, 0x90, 0x64})
	var mp3 []byte
	for range 100 {
		mp3 = append(mp3, frame...)
	}
	m = NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
		base64.StdEncoding.EncodeToString(mp3) + `"}}}]}`))
	if got, want := m.Result().AudioOutput, ceilDiv(100*26_122*audioOutputTokensPerSecond, 1_000_000); got != want {
		t.Errorf("100 MP3 frames: %d audio tokens, want %d", got, want)
	}
	// Near-silent PCM holds samples of -1 (0xFFFF), which read as the sync of an MPEG-1 Layer I
	// header: two of them a frame apart are still no Layer III stream, and the answer counts
	// its bytes. Mutant: the layer not checked, the PCM walked as frames and junk, past 64 KiB
	// timed at 8 kbit/s (~9 600 tokens).
	copy(pcm, []byte{0xff, 0xff, 0x90, 0x64})
	copy(pcm[417:], []byte{0xff, 0xff, 0x90, 0x64})
	m = NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
		base64.StdEncoding.EncodeToString(pcm) + `"}}}]}`))
	if got, want := m.Result().AudioOutput, int64(secs*audioOutputTokensPerSecond); got != want {
		t.Errorf("%d s of raw PCM with Layer I headers a frame apart: %d audio tokens, want %d", secs, got, want)
	}
	// Nor is PCM whose first bytes read "RIFF" a WAV file unless a WAVE form follows: taken for
	// a file, it went to the MP3 walk (clipHead reads no WAV header in it), and past 64 KiB of
	// junk was timed at 8 kbit/s. Mutant: any RIFF taken for a file.
	for i := range pcm[:12] {
		pcm[i] = byte(i * 7)
	}
	copy(pcm[417:], []byte{0, 0, 0, 0})
	copy(pcm, "RIFF")
	copy(pcm[8:], "AVI ")
	m = NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","content":null,"audio":{"id":"a","data":"` +
		base64.StdEncoding.EncodeToString(pcm) + `"}}}]}`))
	if got, want := m.Result().AudioOutput, int64(secs*audioOutputTokensPerSecond); got != want {
		t.Errorf("%d s of raw PCM starting RIFF, no WAVE: %d audio tokens, want %d", secs, got, want)
	}
}

// TestMeterStreamedSpokenAnswerIsRawPCMWhateverItStartsWith: a stream's audio deltas carry raw
// PCM (24 kHz 16-bit), never a file, so a delta whose bytes start like a WAV header counts its
// bytes: one second is 20 tokens. Mutant: the delta timed as a WAV file by its header's byte
// rate, a forged 4 GB/s making the second one token.
func TestMeterStreamedSpokenAnswerIsRawPCMWhateverItStartsWith(t *testing.T) {
	pcm := make([]byte, pcmBytesPerSecond)
	copy(pcm, "RIFF")
	copy(pcm[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(pcm[28:], 0xffffffff)
	r := meterEvents(FormatChat,
		data(`{"choices":[{"delta":{"audio":{"id":"audio_1","data":"`+base64.StdEncoding.EncodeToString(pcm)+`"}}}]}`))
	if got, want := r.AudioOutput, int64(audioOutputTokensPerSecond); got != want {
		t.Errorf("a streamed second of PCM starting like a WAV header: %d audio tokens, want %d", got, want)
	}
}

// TestMeterKeepsTheSpokenAnswersIDs: each spoken answer's id (one a choice), from a stream's
// deltas, which may repeat it, or a whole body, is what a later request sends back to be
// heard again; the proxy records the answer's audio tokens under it.
func TestMeterKeepsTheSpokenAnswersIDs(t *testing.T) {
	streamed := meterEvents(FormatChat,
		data(`{"choices":[{"index":0,"delta":{"role":"assistant","audio":{"id":"audio_a","transcript":"Hi"}}},{"index":1,"delta":{"audio":{"id":"audio_b"}}}]}`),
		data(`{"choices":[{"index":0,"delta":{"audio":{"id":"audio_a","data":"AAAA"}}}]}`),
		data(`{"choices":[{"index":0,"delta":{"audio":{"id":null,"data":"AAAA"}}}]}`))
	if got := strings.Join(streamed.SpokenIDs, ","); got != "audio_a,audio_b" {
		t.Errorf("streamed: spoken ids %q, want audio_a,audio_b", got)
	}
	m := NewMeter(FormatChat)
	m.Body([]byte(`{"choices":[{"message":{"role":"assistant","audio":{"id":"audio_w","data":"AAAA","transcript":"Hi."}}}]}`))
	if got := strings.Join(m.Result().SpokenIDs, ","); got != "audio_w" {
		t.Errorf("whole: spoken ids %q, want audio_w", got)
	}
	// An id longer than a model name is none, as it is to the checks of a request that sends
	// it back (SpokenAnswerIDs, SpokenAnswersSentBack): the Meter keeps none.
	long := strings.Repeat("a", maxModelName+1)
	if got := meterEvents(FormatChat, data(`{"choices":[{"delta":{"audio":{"id":"`+long+`"}}}]}`)).SpokenIDs; len(got) != 0 {
		t.Errorf("an id of %d characters: %d spoken ids kept, want none", len(long), len(got))
	}
	many := `{"choices":[`
	for i := range maxSpokenIDs + 5 {
		if i > 0 {
			many += ","
		}
		many += `{"index":` + strconv.Itoa(i) + `,"delta":{"audio":{"id":"audio_` + strconv.Itoa(i) + `"}}}`
	}
	if got := meterEvents(FormatChat, data(many+`]}`)).SpokenIDs; len(got) != maxSpokenIDs {
		t.Errorf("%d spoken ids kept, want the bound %d", len(got), maxSpokenIDs)
	}
}

// TestSpokenAnswersSentBack lists the ids a chat body sends back, in any case of the key, and
// none for an audio object without one; at most maxSentBack.
func TestSpokenAnswersSentBack(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"user","content":"x"},
		{"role":"assistant","Audio":{"id":"audio_2"}},{"role":"assistant","audio":{}},{"role":"assistant","audio":null},
		{"role":"assistant","audio":{"id":""}}]}` // an empty id names no answer to look up
	if got := strings.Join(SpokenAnswersSentBack([]byte(body)), ","); got != "audio_1,audio_2" {
		t.Errorf("sent back %q, want audio_1,audio_2", got)
	}
	many := `{"messages":[`
	for i := range maxSentBack + 3 {
		if i > 0 {
			many += ","
		}
		many += `{"role":"assistant","audio":{"id":"audio_` + strconv.Itoa(i) + `"}}`
	}
	if got := SpokenAnswersSentBack([]byte(many + `]}`)); len(got) != maxSentBack {
		t.Errorf("%d ids listed, want the bound %d", len(got), maxSentBack)
	}
}

// TestSpokenAnswerIDsListsEachUnderAnyKeyCase: the ids a chat body sends back, for the check of
// whose answers they are, are read as the provider reads them, with Go's encoding/json: the
// "audio" key and its "id" in any case; each id once; past the limit, more. Mutant: "audio"
// matched exactly, an answer sent back under "Audio" left unchecked and heard by another user.
func TestSpokenAnswerIDsListsEachUnderAnyKeyCase(t *testing.T) {
	body := `{"messages":[{"role":"assistant","audio":{"id":"audio_1"}},{"role":"assistant","Audio":{"id":"audio_2"}},
		{"role":"assistant","AUDIO":{"ID":"audio_3"}},{"role":"assistant","audio":{"id":"audio_1"}},{"role":"assistant","audio":{"id":""}}]}`
	ids, more := SpokenAnswerIDs([]byte(body), 10)
	if got := strings.Join(ids, ","); got != "audio_1,audio_2,audio_3" || more {
		t.Errorf("ids %q (more %v), want audio_1,audio_2,audio_3 and no more", got, more)
	}
	ids, more = SpokenAnswerIDs([]byte(body), 2)
	if got := strings.Join(ids, ","); got != "audio_1,audio_2" || !more {
		t.Errorf("limit 2: ids %q (more %v), want audio_1,audio_2 and more", got, more)
	}
}
