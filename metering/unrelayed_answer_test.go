package metering

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// spokenCases are chat answers whose spoken audio an UnrelayedAnswer must measure as
// Meter.Body does: WAV, MP3 (behind a tag, with junk, variable rate, past the junk bound), raw
// PCM, data written with JSON escapes, several choices and audio objects, and audio where it is
// not an answer's.
func spokenCases() map[string]string {
	frames := func(parts ...[]byte) string { return b64(parts...) }
	junk := bytes.Repeat([]byte{0xff, 0x00, 0x12}, 3000)
	noFF := bytes.Repeat([]byte{0x12, 0x34, 0x56}, 40_000) // a skip past the bound with no 0xff in it
	pcm := make([]byte, 96_001)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range pcm {
		pcm[i] = byte(rng.Uint32())
	}
	answer := func(audio string) string {
		return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
			`"audio":{"id":"audio_1","data":"` + audio + `","transcript":"hi"}},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`
	}
	wav := wavClip(8_000, 30)
	mp3 := frames(id3(700), mpeg1(9, 128).frames(20))
	return map[string]string{
		"wav":                      answer(wav),
		"wav short":                answer(wavClip(8_000, 0)),
		"mp3 behind a tag":         answer(mp3),
		"mp3 variable rate":        answer(frames(mpeg1(14, 320).frame(), mpeg1(1, 32).frames(30))),
		"mp3 with junk":            answer(frames(mpeg1(1, 32).frames(10), junk, mpeg2(4, 32).frames(10))),
		"mp3 past the junk bound":  answer(frames(mpeg1(1, 32).frames(5), bytes.Repeat([]byte{0xff, 0x00}, 100_000))),
		"mp3 junk without 0xff":    answer(frames(mpeg1(1, 32).frames(5), noFF, mpeg1(1, 32).frames(5))),
		"mp3 tag past its end":     answer(frames(id3(1 << 20)[:2000])),
		"pcm":                      answer(base64.StdEncoding.EncodeToString(pcm)),
		"pcm padded":               answer(base64.StdEncoding.EncodeToString(pcm[:1000])),
		"escaped slashes":          answer(strings.ReplaceAll(mp3, "/", `\/`)),
		"escaped wav":              answer(strings.ReplaceAll(wav, "A", `\u0041`)),
		"line breaks":              answer(strings.ReplaceAll(wav[:4000], "AAAA", `AAAA\r\n`) + wav[4000:]),
		"surrogates":               answer(`\ud83d\ude00\ud83d\u0041\udc00\ud800` + wav[:100]),
		"not base64":               answer(`#$%^&*` + wav),
		"padding mid-stream":       answer(frames(mpeg1(1, 32).frames(3)) + frames(mpeg1(1, 32).frames(1))[:8] + "AA==" + mp3),
		"two choices, two audios":  `{"choices":[{"message":{"audio":{"data":"` + wav + `"},"audio":{"data":"` + mp3 + `","data":"` + wav + `"}}},{"message":{"audio":{"data":"` + mp3 + `"}}}]}`,
		"second message ignored":   `{"choices":[{"message":{"audio":{"data":"` + wav + `"}},"message":{"audio":{"data":"` + mp3 + `"}}}]}`,
		"first message not object": `{"choices":[{"message":"x","message":{"audio":{"data":"` + mp3 + `"}}}]}`,
		"choices as an object":     `{"choices":{"a":{"message":{"audio":{"data":"` + wav + `"}}}}}`,
		"escaped keys":             `{"ch\u006fices":[{"m\u0065ssage":{"aud\u0069o":{"d\u0061ta":"` + wav + `"}}}]}`,
		"audio elsewhere":          `{"x":{"choices":[{"message":{"audio":{"data":"` + wav + `"}}}]},"choices":[{"delta":{"audio":{"data":"` + wav + `"}},"message":{"content":"{\"audio\":{\"data\":\"` + wav[:400] + `\"}}"}}]}`,
		"deep":                     `{"choices":[{"message":{"audio":{"data":{"data":"` + wav + `"},"x":[[[{"data":"a"}]]],"data":"` + mp3 + `"}}}]}`,
		"not an object":            ` [` + answer(wav) + `]`,
		"bom and space":            "\ufeff \n" + answer(wav),
		"data not a string":        `{"choices":[{"message":{"audio":{"data":123,"data":null,"data":["` + wav + `"]}}}]}`,
	}
}

// measureWhole is what Meter.Body counts of a whole answer's audio.
func measureWhole(body string) (pcm, micros int64) {
	m := NewMeter(FormatChat)
	m.Body([]byte(body))
	return m.pcmBytes, m.clipMicros
}

// measurePieces is what an UnrelayedAnswer counts of the answer written in pieces of the sizes
// sizes gives, in turn.
func measurePieces(body string, sizes func() int) (pcm, micros int64) {
	m := NewMeter(FormatChat)
	ua := m.NewUnrelayedAnswer()
	for b := []byte(body); len(b) > 0; {
		n := min(len(b), max(1, sizes()))
		ua.Write(b[:n])
		b = b[n:]
	}
	m.AddSpoken(ua)
	return m.pcmBytes, m.clipMicros
}

// TestUnrelayedAnswerMeasuresAudioAsTheWholeAnswer: the audio of an answer read past in pieces (one too
// large to relay) counts what the same answer read whole counts, however it is cut.
func TestUnrelayedAnswerMeasuresAudioAsTheWholeAnswer(t *testing.T) {
	for name, body := range spokenCases() {
		if !gjson.Valid(string(TrimBody([]byte(body)))) && name != "not an object" {
			t.Fatalf("%s: not valid JSON", name)
		}
		wantPCM, wantUS := measureWhole(body)
		for _, size := range []int{1, 3, 7, 1000, 32 << 10, len(body)} {
			pcm, us := measurePieces(body, func() int { return size })
			if pcm != wantPCM || us != wantUS {
				t.Errorf("%s in pieces of %d: pcm %d bytes, clips %d µs; read whole %d, %d", name, size, pcm, us, wantPCM, wantUS)
			}
		}
		rng := rand.New(rand.NewPCG(3, uint64(len(body))))
		pcm, us := measurePieces(body, func() int { return rng.IntN(5000) })
		if pcm != wantPCM || us != wantUS {
			t.Errorf("%s in random pieces: pcm %d bytes, clips %d µs; read whole %d, %d", name, pcm, us, wantPCM, wantUS)
		}
	}
	// Not vacuous: the cases hold audio of each kind.
	if pcm, _ := measureWhole(spokenCases()["pcm"]); pcm != 96_001 {
		t.Fatalf("pcm case counted %d bytes, want 96 001", pcm)
	}
	if _, us := measureWhole(spokenCases()["wav"]); us < 30_000_000 || us > 30_010_000 {
		t.Fatalf("wav case counted %d µs, want 30 s", us)
	}
}

// FuzzUnrelayedAnswer: any answer, cut anywhere, counts the same audio in pieces as whole.
func FuzzUnrelayedAnswer(f *testing.F) {
	for _, body := range spokenCases() {
		if len(body) < 20_000 {
			f.Add(body, uint16(7))
		}
	}
	f.Add(`{"choices":[{"message":{"audio":{"data":"`+b64(mpeg1(1, 32).frames(1))+`"}}}]}`, uint16(13))
	f.Add(`{"x":{"choices":[{"message":{"audio":{"data":"`+b64(mpeg1(1, 32).frames(1))+`"}}}]},"logprobs":[{"a":"b","c":[1,{"d":"e"}]}],`+
		`"choices":[{"logprobs":{"content":[{"token":"x","message":{"audio":{"data":"AAAA"}}}]},"message":{"audio":{"data":"`+
		wavClip(100, 1)+`"}}}]}`, uint16(3))
	f.Add(`{"choices":[{"message":{"audio":{"data":"`+b64(id3(20), mpeg2(4, 32).frames(1))+`"}}}]}`, uint16(1))
	for _, body := range textCases() {
		f.Add(body, uint16(5))
	}
	// Answers in llama.cpp's server's own shape (Meter.serverAnswer), alone and in an array.
	f.Add(llamaOwnFinal(0, `ab\"c`, 90, 16, true), uint16(9))
	f.Add("["+llamaOwnFinal(0, "ab", 90, 16, true)+","+llamaOwnFinal(1, "cd", 9, 1, false)+"]", uint16(4))
	f.Fuzz(func(t *testing.T, body string, seed uint16) {
		if !gjson.Valid(string(TrimBody([]byte(body)))) {
			return // read whole, it is refused as cut short (proxy's cutJSON), never metered
		}
		wantPCM, wantUS := measureWhole(body)
		rng := rand.New(rand.NewPCG(uint64(seed), 0))
		pcm, us := measurePieces(body, func() int { return rng.IntN(int(seed%64) + 2) })
		if pcm != wantPCM || us != wantUS {
			t.Fatalf("in pieces: pcm %d, clips %d µs; read whole %d, %d", pcm, us, wantPCM, wantUS)
		}
		for _, f := range textFormats {
			want := textWhole(f, body)
			rng := rand.New(rand.NewPCG(uint64(seed), 1))
			if got := textPieces(f, body, func() int { return rng.IntN(int(seed%64) + 2) }); got != want {
				t.Fatalf("format %d in pieces: %d bytes of text; read whole %d", f, got, want)
			}
		}
		// Whole, it has ended; cut anywhere inside its object, it is open (proxy's
		// meterOversized reads no report from it then).
		if open := strings.IndexByte(body, '{'); open >= 0 && TrimBody([]byte(body))[0] == '{' {
			end := strings.LastIndexByte(body, '}')
			for _, f := range textFormats {
				rng := rand.New(rand.NewPCG(uint64(seed), 2))
				sizes := func() int { return rng.IntN(int(seed%64) + 2) }
				if ua := unrelayedPieces(f, body, sizes); ua.Open() {
					t.Fatalf("format %d: read whole, it is still open", f)
				}
				cut := open + 1 + int(seed)%(end-open)
				if ua := unrelayedPieces(f, body[:cut], sizes); !ua.Open() {
					t.Fatalf("format %d: cut at %d of %d, it has ended", f, cut, len(body))
				}
			}
		}
	})
}

// textFormats are the formats whose text an UnrelayedAnswer counts (an embeddings answer is read
// as a chat one).
var textFormats = []Format{FormatChat, FormatCompletions, FormatAnthropic, FormatResponses}

// textCases are answers whose text an UnrelayedAnswer must count as Meter.Body does: every
// field openAIChoices reads, and an Anthropic message's and a Responses answer's, escapes,
// duplicate keys (gjson's Get reads the first, ForEach every one), text that is no string, raw
// JSON of every kind, and text where it is not an answer's.
func textCases() map[string]string {
	return map[string]string{
		"chunked content": `{"choices":[{"message":{"role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"abc"},` +
			`{"text":"de","text":"no"},[{"text":"no"}]]},{"type":"text","text":"fgh"},{"type":"thinking","thinking":"ij","thinking":"no"},` +
			`"text",["text"],{"type":"text","text":["no"]},{"thinking":{"text":"no"}},{"type":"reference","reference_ids":[1]}],"reasoning":[{"text":"no"}]}}]}`,
		"reasoning under both names": `{"choices":[{"message":{"reasoning":"abcd","content":"x","reasoning_content":"abcd","reasoning":"e","refusal":"yz"}},` +
			`{"message":{"reasoning_content":"abc","reasoning":"de"}},{"message":{"reasoning_content":{"a":"no"},"reasoning":["no"]}}]}`,
		"anthropic": `{"id":"msg","type":"message","content":[{"type":"thinking","thinking":"ab","signature":"s"},{"type":"text","text":"\u00e9\n"},` +
			`{"type":"tool_use","id":"t","name":"f","input":{ "a" : [1, "\"x\""] }}],"usage":{"input_tokens":1}}`,
		"anthropic inputs": `{"content":[{"input":"a\"b"},{"input":12.5e3 },{"input":true},{"input":null,"input":{"no":1}},{"input":[]},` +
			`{"type":"text","text":"x","text":"no","thinking":7,"thinking":"no"},"text",["text"],{"x":{"text":"no"}}],"content":[{"text":"no"}]}`,
		"anthropic content object": `{"content":{"a":{"text":"abc"},"b":{"input":-1}},"x":{"content":[{"text":"no"}]}}`,
		"responses": `{"id":"resp","object":"response","output":[{"type":"reasoning","summary":[{"text":"ok"}]},` +
			`{"type":"message","content":[{"type":"output_text","text":"ab\ud83d\ude00","annotations":[{"text":"no"}]},{"type":"refusal","refusal":"ok"}]},` +
			`{"type":"function_call","arguments":"{\"a\":1}","arguments":"no"}],"output":[{"arguments":"no"}]}`,
		"anthropic compaction": `{"content":[{"type":"compaction","content":"abc","content":"no"},{"content":"de","t\u0079pe":"c\u006fmpaction"},` +
			`{"content":"no","type":"compaction ","type":"compaction"},{"type":["compaction"],"content":"no"},{"type":7,"content":"no"},` +
			`{"content":["no"],"type":"compaction"},{"content":"no","type":"compactio"},{"content":"no"},{"type":"mcp_tool_result","content":"no"}]}`,
		"responses tools": `{"output":[{"type":"code_interpreter_call","code":"ab","code":"no","outputs":[{"logs":"no"}]},` +
			`{"action":{"commands":["c","d",7,["no"]],"commands":["no"]},"action":{"commands":["no"]}},{"action":{"commands":{"a":"e"}}},` +
			`{"action":"commands"},{"operation":{"diff":"f\n","diff":"no"}},{"operation":[{"diff":"no"}]},` +
			`{"action":{"command":["g",{"a":"no"}],"commands":["h"],"command":["no"]}}]}`,
		"responses odd": `{"output":{"a":{"content":{"p":{"text":"xy"}},"content":[{"text":"no"}]},"b":"text","c":[{"text":"no"}],"d":{"arguments":{"a":"no"}}}}`,
		"content":       `{"choices":[{"message":{"role":"assistant","content":"Hello there."}}]}`,
		"every field":   `{"choices":[{"message":{"content":"a","reasoning_content":"bb","reasoning":"ccc","refusal":"dddd","audio":{"transcript":"eeeee","data":"AAAA"}}}]}`,
		"escapes":       `{"choices":[{"message":{"content":"\u00e9\n\"\\\/\ud83d\ude00\ud83d x\udc00"}}]}`,
		"tool calls":    `{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"a\":1}","arguments":"no"}},{"function":"x","function":["arguments"],"function":{"x":{"arguments":"no"}},"function":{"arguments":"yes"},"function":{"arguments":"no"}},{"function":{"arguments":{"a":1}},"function":{"arguments":"no"}}]}}]}`,
		"custom tool calls": `{"choices":[{"message":{"tool_calls":[{"type":"custom","custom":{"name":"f","input":"ab","input":"no"},"custom":{"input":"no"}},` +
			`{"custom":"input"},{"custom":{"input":{"a":"no"}}},{"custom":{"x":{"input":"no"}},"custom":{"input":"no"}},{"custom":{"inp\u0075t":"c"},"function":{"arguments":"d"}}]}}]}`,
		"function call":  `{"choices":[{"message":{"function_call":{"name":"f","arguments":"{}"},"function_call":{"arguments":"yes"}}}]}`,
		"duplicates":     `{"choices":[{"message":{"content":"one","content":"two"},"message":{"content":"not read"}},{"message":{"content":"three"}}],"choices":[{"message":{"content":"four"}}]}`,
		"choices object": `{"choices":{"a":{"message":{"content":"x"}},"b":{"message":{"tool_calls":{"t":{"function":{"arguments":"yz"}}}}}}}`,
		"no strings":     `{"choices":[{"message":{"content":["x"],"refusal":{"a":"b"},"reasoning":12,"tool_calls":"x"}}]}`,
		"elsewhere":      `{"x":{"choices":[{"message":{"content":"no"}}]},"choices":[{"delta":{"content":"no"},"logprobs":{"content":[{"token":"no"}]},"message":{"content":"yes","x":{"content":"no"}}}]}`,
		"completions":    `{"choices":[{"text":"Hello","text":"no","index":0},{"text":"!"},{"text":{"a":"b"}}]}`,
		"completions batch": `[{"choices":[{"text":"ab","index":0}],"usage":{"prompt_tokens":1,"completion_tokens":1}},` +
			`{"choices":[{"text":"cde","text":"no"}],"choices":[{"text":"no"}]},7,"choices",[{"choices":[{"text":"no"}]}],{"x":{"choices":[{"text":"no"}]}}]`,
		"escaped keys": `{"ch\u006fices":[{"m\u0065ssage":{"c\u006fntent":"x","reas\u006fning_content":"yy"},"t\u0065xt":"zzz"}]}`,
	}
}

// textWhole is how many bytes of text Meter.Body counts of a whole answer in format f.
func textWhole(f Format, body string) int64 {
	m := NewMeter(f)
	m.Body([]byte(body))
	return m.Result().OutputChars
}

// textPieces is how many bytes of text an UnrelayedAnswer counts of the answer written in pieces.
func textPieces(f Format, body string, sizes func() int) int64 {
	m := NewMeter(f)
	ua := m.NewUnrelayedAnswer()
	for b := []byte(body); len(b) > 0; {
		n := min(len(b), max(1, sizes()))
		ua.Write(b[:n])
		b = b[n:]
	}
	m.AddUnreported(ua)
	return m.Result().OutputChars
}

// unrelayedPieces is body written to an UnrelayedAnswer of format f in pieces of sizes.
func unrelayedPieces(f Format, body string, sizes func() int) *UnrelayedAnswer {
	ua := NewMeter(f).NewUnrelayedAnswer()
	for b := []byte(body); len(b) > 0; {
		n := min(len(b), max(1, sizes()))
		ua.Write(b[:n])
		b = b[n:]
	}
	return ua
}

// TestUnrelayedAnswerCountsTextAsTheWholeAnswer: the text of an answer read past in pieces
// without a usage report (one too large to relay) counts what the same answer read whole
// counts, in every format, however it is cut.
func TestUnrelayedAnswerCountsTextAsTheWholeAnswer(t *testing.T) {
	cases := textCases()
	for name, body := range spokenCases() {
		cases["spoken "+name] = body
	}
	for name, body := range cases {
		if !gjson.Valid(string(TrimBody([]byte(body)))) && name != "spoken not an object" {
			t.Fatalf("%s: not valid JSON", name)
		}
		for _, f := range textFormats {
			want := textWhole(f, body)
			for _, size := range []int{1, 2, 5, 64, len(body)} {
				if got := textPieces(f, body, func() int { return size }); got != want {
					t.Errorf("%s (format %d) in pieces of %d: %d bytes of text; read whole %d", name, f, size, got, want)
				}
			}
		}
	}
	// Not vacuous: the cases hold text of each kind.
	for name, want := range map[string]int64{"chunked content": 3 + 2 + 3 + 2, "reasoning under both names": 5 + 1 + 2 + 3, "every field": 1 + 3 + 4 + 5, "tool calls": 10, "custom tool calls": 4, "function call": 5, "duplicates": 15, "completions": 6, "completions batch": 5,
		"anthropic": 2 + 3 + 22, "anthropic inputs": 6 + 6 + 4 + 4 + 2 + 1, "anthropic content object": 5, "anthropic compaction": 5, "responses tools": 2 + 2 + 1 + 2 + 2, "responses": 6 + 7 + 2 + 2, "responses odd": 2} {
		f := FormatChat
		switch {
		case strings.HasPrefix(name, "completions"):
			f = FormatCompletions
		case strings.HasPrefix(name, "anthropic"):
			f = FormatAnthropic
		case strings.HasPrefix(name, "responses"):
			f = FormatResponses
		}
		if got := textWhole(f, cases[name]); got != want {
			t.Errorf("%s read whole: %d bytes of text, want %d", name, got, want)
		}
	}
}

// mp3MicrosBefore is the walk mp3Micros made before it was shared with UnrelayedAnswer: over a
// buffered reader, whose skips of bytes without 0xff stop at the buffer's end.
func mp3MicrosBefore(data string, off int64) int64 {
	r := bufio.NewReaderSize(base64.NewDecoder(base64.StdEncoding, strings.NewReader(data)), 64<<10)
	if off > int64(len(data)) {
		return 0
	}
	if _, err := r.Discard(int(off)); err != nil {
		return 0
	}
	var micros, read, junk int64
	for {
		h, err := r.Peek(4)
		if err != nil {
			return micros
		}
		n, us := mp3Frame(h)
		if n == 0 {
			buf, _ := r.Peek(r.Buffered())
			if i := bytes.IndexByte(buf[1:], 0xff); i >= 0 {
				n = i + 1
			} else {
				n = len(buf)
			}
			if junk += int64(n); junk > maxMP3Junk {
				rest := max(0, int64(base64.StdEncoding.DecodedLen(len(data)))-off-read)
				return micros + rest*1_000_000/mp3LowestByteRate
			}
		}
		micros += us
		read += int64(n)
		if _, err := r.Discard(n); err != nil {
			return micros
		}
	}
}

// TestMP3WalkTimesAsBefore: the shared walk times MP3 data as the one before it did: frames,
// tags, junk and junk past the bound alike.
func TestMP3WalkTimesAsBefore(t *testing.T) {
	for name, data := range map[string]string{
		"frames":           b64(mpeg1(9, 128).frames(60)),
		"tag":              b64(id3(5_000), mpeg2(4, 32).frames(78)),
		"variable":         b64(mpeg1(14, 320).frame(), mpeg1(1, 32).frames(30)),
		"junk":             b64(mpeg1(1, 32).frames(30), bytes.Repeat([]byte{0xff, 0x00, 0x12}, 3000), mpeg1(1, 32).frames(30)),
		"junk past bound":  b64(mpeg1(1, 32).frames(10), bytes.Repeat([]byte{0xff, 0x00}, 1_000_000)),
		"cut last frame":   b64(mpeg1(1, 32).frames(3))[:300],
		"tag past the end": b64(id3(1 << 20)[:100]),
	} {
		kind, _, off := clipHead(data)
		if kind != clipMP3 {
			t.Fatalf("%s: kind %d", name, kind)
		}
		if got, want := mp3Micros(data, off), mp3MicrosBefore(data, off); got != want {
			t.Errorf("%s: %d µs, before %d", name, got, want)
		}
	}
}

// TestUnrelayedAnswerCutCountsWhatWasRead: an answer cut before its end (read up to the bound
// on what is read past) counts the value being read as far as it was read: text by
// its bytes, a tool input's raw JSON by its bytes, audio data as the same data ended there would
// be measured. What follows the cut is not read.
func TestUnrelayedAnswerCutCountsWhatWasRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format Format
		head   string // the answer up to the value cut
		value  string // the value, cut at each of its bytes
		closer string // what ends the answer, for the same data ended at the cut
	}{
		{"chat text", FormatChat, `{"choices":[{"message":{"content":"`, strings.Repeat("words ", 200), `"}}]}`},
		{"anthropic input", FormatAnthropic, `{"content":[{"type":"text","text":"ab"},{"type":"tool_use","input":`, `{"a":["` + strings.Repeat("x", 300), ``},
		{"wav", FormatChat, `{"choices":[{"message":{"audio":{"data":"`, wavClip(8000, 1), `"}}}]}`},
		{"mp3", FormatChat, `{"choices":[{"message":{"audio":{"data":"`, b64(mpeg1(1, 32).frames(20)), `"}}}]}`},
	} {
		for _, k := range []int{0, 1, 5, 60, len(tc.value) / 2, len(tc.value) - 1} {
			m := NewMeter(tc.format)
			ua := m.NewUnrelayedAnswer()
			ua.Write([]byte(tc.head + tc.value[:k]))
			ua.Cut()
			ua.Write([]byte(tc.value[k:] + `"}}]}`)) // past the cut: not read
			m.AddUnreported(ua)
			got := m.Result()
			var want Result
			if tc.closer == "" { // raw JSON: its bytes read, and the text before it
				want.OutputChars = 2 + int64(k)
			} else {
				w := NewMeter(tc.format)
				w.Body([]byte(tc.head + tc.value[:k] + tc.closer))
				want = w.Result()
			}
			if got.OutputChars != want.OutputChars || got.AudioOutput != want.AudioOutput {
				t.Errorf("%s cut %d bytes into its value: %d bytes of text, %d audio tokens; want %d, %d", tc.name, k,
					got.OutputChars, got.AudioOutput, want.OutputChars, want.AudioOutput)
			}
		}
	}
	// Not vacuous: the audio cut halfway counts.
	m := NewMeter(FormatChat)
	ua := m.NewUnrelayedAnswer()
	clip := wavClip(8000, 1)
	ua.Write([]byte(`{"choices":[{"message":{"audio":{"data":"` + clip[:len(clip)/2]))
	ua.Cut()
	m.AddUnreported(ua)
	if r := m.Result(); r.AudioOutput == 0 {
		t.Fatal("half a second of WAV cut counted no audio")
	}
}

// TestUnrelayedAnswerLeavesTheEchoOut: a completions answer to a call with echo begins each
// choice's text with its prompt, which Meter.Body leaves out of the output (completionText).
// Read past in pieces of any size, the same answer counts the same text: the echo left out as
// far as the text is the prompt, byte for byte (escapes read as what they stand for), all of
// it counted where the text parts from the prompt, and choice i matched against prompt i/n.
func TestUnrelayedAnswerLeavesTheEchoOut(t *testing.T) {
	const p1, p2 = "Say hello to the world, \u00e9 and all.", "Count to three."
	choice := func(i int, text string) string {
		return `{"text":` + text + `,"index":` + strconv.Itoa(i) + `,"logprobs":null,"finish_reason":"stop"}`
	}
	for _, tc := range []struct {
		name    string
		prompts []string
		n       int64
		body    string
		want    int64 // bytes of output text
	}{
		{"echoed", []string{p1}, 1, `{"choices":[` + choice(0, `"`+p1+` Hello!"`) + `]}`, 7},
		{"echoed, escaped", []string{p1}, 1, `{"choices":[` + choice(0, `"Say hello to the world, \u00e9 and all. Hello!\n"`) + `]}`, 8},
		{"text shorter than its prompt, all echo", []string{p1}, 1, `{"choices":[` + choice(0, `"Say hello"`) + `]}`, 0},
		{"not echoed", []string{p1}, 1, `{"choices":[` + choice(0, `"Hello!"`) + `]}`, 6},
		{"parts from its prompt midway", []string{p1}, 1, `{"choices":[` + choice(0, `"Say hello to the moon"`) + `]}`, 21},
		{"a batch, n=2", []string{p1, p2}, 2, `{"choices":[` + choice(0, `"`+p1+` A"`) + `,` + choice(1, `"`+p1+` BB"`) + `,` +
			choice(2, `"`+p2+` 1 2 3"`) + `,` + choice(3, `"`+p2+`"`) + `]}`, 2 + 3 + 6},
		{"more choices than prompts", []string{p2}, 1, `{"choices":[` + choice(0, `"`+p2+`"`) + `,` + choice(1, `"`+p2+`"`) + `]}`, int64(len(p2))},
		{"a token array's prompt, unknown", []string{""}, 1, `{"choices":[` + choice(0, `"`+p2+`"`) + `]}`, int64(len(p2))},
	} {
		echoCountedAlike(t, tc.name, tc.prompts, tc.n, tc.body, tc.want)
	}
}
