package metering

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

// TestInputEstimateStripsThinkingBeforeAUserTurnOfTextBlocks: a user turn whose content is a
// list of text blocks (not tool results alone) is a new turn, as one given as a string is:
// Anthropic strips the thinking before it, unbilled. Mutant: any list of blocks read as tool
// results, and 40 000 bytes of stripped thinking charged.
func TestInputEstimateStripsThinkingBeforeAUserTurnOfTextBlocks(t *testing.T) {
	thought := strings.Repeat("x", 40_000)
	for _, next := range []string{
		`[{"type":"text","text":"next"}]`,
		`[{"type":"tool_result","tool_use_id":"t","content":"ok"},{"type":"text","text":"next"}]`,
	} {
		body := `{"model":"m","messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"` + thought + `","signature":"s"},{"type":"text","text":"done"}]},` +
			`{"role":"user","content":` + next + `}]}`
		if got := EstimateInputTokens(FormatAnthropic, []byte(body)); got > 100 {
			t.Errorf("user turn %s: estimate %d tokens, want a few (the earlier turn's thinking is stripped)", next, got)
		}
	}
}

// TestInputEstimateCountsContentAtTheDepthBoundByItsRawSize: a value nested exactly
// maxContentDepth levels deep is counted by its raw JSON, not walked (the bound that keeps the
// estimate linear). A token array there counts its bytes, not a token an element. Mutant: the
// bound off by one, the array at the bound walked.
func TestInputEstimateCountsContentAtTheDepthBoundByItsRawSize(t *testing.T) {
	inner := "[" + strings.TrimSuffix(strings.Repeat("1,", 40), ",") + "]" // 81 bytes raw; 40 tokens walked
	prompt := strings.Repeat("[", maxContentDepth) + inner + strings.Repeat("]", maxContentDepth)
	body := `{"model":"m","prompt":` + prompt + `}`
	if got, want := EstimateInputTokens(FormatCompletions, []byte(body)), ceilDiv(int64(len(inner)), bytesPerToken); got != want {
		t.Errorf("a token array nested %d deep: estimate %d tokens, want %d (its %d raw bytes)", maxContentDepth, got, want, len(inner))
	}
}

// TestInputEstimateCountsABlockAtTheDepthBoundByItsRawSize: a content block given as an
// object (web_fetch_tool_result's) whose parent sits one level above maxContentDepth is
// counted by its raw JSON, not parsed for its text, as textLen counts an array there. Mutant:
// that bound off by one, the block parsed and its 4 000 bytes of other members not counted.
func TestInputEstimateCountsABlockAtTheDepthBoundByItsRawSize(t *testing.T) {
	deepest := `{"type":"x","pad":"` + strings.Repeat("p", 4_000) + `","content":"a"}`
	block := deepest
	for range maxContentDepth {
		block = `{"type":"x","content":` + block + `}`
	}
	body := `{"model":"m","messages":[{"role":"user","content":[` + block + `]}]}`
	want := ceilDiv(int64(len(deepest)), bytesPerToken) + tokensPerMessage
	if got := EstimateInputTokens(FormatAnthropic, []byte(body)); got != want {
		t.Errorf("a block nested %d deep: estimate %d tokens, want %d (its %d raw bytes and the message)", maxContentDepth, got, want, len(deepest))
	}
}

// TestInputEstimateCountsADocumentsBlocksAtTheDepthBoundByTheirRawSize: an Anthropic document
// of content blocks, nested in tool results so that its blocks stand at maxContentDepth, is
// counted by their raw JSON. Mutant: the document's blocks looked at one level less deep than
// they stand, walked for their text, and the bound passed.
func TestInputEstimateCountsADocumentsBlocksAtTheDepthBoundByTheirRawSize(t *testing.T) {
	blocks := `[{"type":"text","text":"` + strings.Repeat("t", 8_000) + `","pad":"` + strings.Repeat("p", 8_000) + `"}]`
	part := `{"type":"document","source":{"type":"content","content":` + blocks + `}}`
	for range maxContentDepth - 1 {
		part = `{"type":"tool_result","tool_use_id":"t","content":[` + part + `]}`
	}
	body := `{"model":"m","messages":[{"role":"user","content":[` + part + `]}]}`
	want := ceilDiv(int64(len(blocks)), bytesPerToken) + tokensPerMessage
	if got := EstimateInputTokens(FormatAnthropic, []byte(body)); got != want {
		t.Errorf("a document nested %d deep: estimate %d tokens, want %d (its blocks' %d raw bytes and the message)", maxContentDepth-1, got, want, len(blocks))
	}
}

// TestEstimateResponsesMCPToolListAndLocalShellCommand: a Responses input's mcp_list_tools item
// sends back an MCP server's tool list, and a local_shell_call item the command the model ran:
// the provider reads both as input, and they count by their bytes (the list's raw JSON, the
// command's strings) and a message each. Mutants: either left out.
func TestEstimateResponsesMCPToolListAndLocalShellCommand(t *testing.T) {
	tools := `[{"name":"search","input_schema":{"type":"object","description":"` + strings.Repeat("d", 4_000) + `"}}]`
	command := strings.Repeat("c", 4_000)
	for _, tc := range []struct {
		name, item string
		bytes      int64
	}{
		{"mcp_list_tools", `{"type":"mcp_list_tools","id":"l","server_label":"s","tools":` + tools + `}`, int64(len(tools))},
		{"local_shell_call", `{"type":"local_shell_call","id":"s","call_id":"c","status":"completed","action":{"type":"exec","command":["bash","-c","` + command + `"]}}`, int64(len("bash") + len("-c") + len(command))},
	} {
		body := `{"model":"m","input":[` + tc.item + `]}`
		want := ceilDiv(tc.bytes, bytesPerToken) + tokensPerMessage
		if got := EstimateInputTokens(FormatResponses, []byte(body)); got != want {
			t.Errorf("%s: estimate %d tokens, want %d (%d bytes and the item)", tc.name, got, want, tc.bytes)
		}
	}
}

// TestAudioClipID3FooterIsNotJunk: an ID3v2 tag whose flags announce a footer is followed by
// 10 more bytes ("3DI"...) before the frames; they are the tag's, not junk the walk skips, and
// a tagged stream plays as long as the same stream untagged, even when its junk comes within
// 10 bytes of maxMP3Junk. Mutant: the footer left out of the offset, its 10 bytes counted as
// junk, the bound passed and the rest timed at the lowest bit rate (8 kbit/s).
func TestAudioClipID3FooterIsNotJunk(t *testing.T) {
	stream := b64(mpeg1(1, 32).frames(1), bytes.Repeat([]byte{0x12}, maxMP3Junk-5), mpeg1(1, 32).frames(1))
	tag := id3(100)
	tag[5] |= 0x10 // a footer follows the tag
	footer := append([]byte("3DI"), tag[3:10]...)
	untagged := clipMicros(stream)
	if untagged <= 0 || untagged > 3_000_000 {
		t.Fatalf("the untagged stream plays %d µs, want its two seconds of frames (the junk within the bound)", untagged)
	}
	raw, _ := base64.StdEncoding.DecodeString(stream)
	if got := clipMicros(b64(tag, footer, raw)); got != untagged {
		t.Errorf("behind an ID3 tag with a footer the stream plays %d µs, want %d as untagged", got, untagged)
	}
}

// TestAudioClipPaddedFramesAreOneByteLonger: a Layer III frame whose header sets the padding
// bit is one byte longer; the walk steps over it to the next frame, and a stream of padded
// frames wastes none of its junk allowance (maxMP3Junk) on their last bytes. Mutant: the
// padding byte left out, each frame's last byte skipped as junk, the bound passed and the rest
// timed at the lowest bit rate.
func TestAudioClipPaddedFramesAreOneByteLonger(t *testing.T) {
	k := mpeg1(1, 32)
	size := k.perFrame/8*k.kbps*1000/k.rate + 1 // 104 bytes and the padding byte
	padded := func(n int) []byte {
		var out []byte
		for range n {
			f := make([]byte, size)
			copy(f, []byte{0xff, k.b1, k.index<<4 | 0x02, 0})
			out = append(out, f...)
		}
		return out
	}
	stream := b64(padded(10), bytes.Repeat([]byte{0x12}, maxMP3Junk-5), padded(1))
	want := 11 * int64(k.perFrame*1_000_000/k.rate) // each frame's time, as mp3Frame rounds it
	if got := clipMicros(stream); got != want {
		t.Errorf("11 padded frames and junk within the bound play %d µs, want %d", got, want)
	}
}

// TestDecodeBase64AtGivesTheBytesAsked: decodeBase64At hands back the n bytes from any offset
// (fewer only at the data's end), whatever the offset's place in its base64 quantum. Its
// callers ask 4 bytes past an offset today, which the mutant below still serves; a caller
// asking more from an offset not a multiple of 3 was handed short. Mutant: too few characters
// decoded for the bytes skipped at the start (n+2 for n+5).
func TestDecodeBase64AtGivesTheBytesAsked(t *testing.T) {
	raw := make([]byte, 64)
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	data := base64.StdEncoding.EncodeToString(raw)
	for off := range 6 {
		for n := 1; n <= 40; n++ {
			got, ok := decodeBase64At(data, int64(off), n)
			if want := raw[off:min(len(raw), off+n)]; !ok || !bytes.Equal(got, want) {
				t.Fatalf("decodeBase64At(off %d, n %d) = %x, %v; want %x", off, n, got, ok, want)
			}
		}
	}
}

// TestBase64LenLeavesOutTwoPaddingCharactersAtMost: a streamed spoken answer's raw PCM is
// counted by base64Len; base64 pads with at most two '=', so only the last two are left out.
// Mutant: a third '=' taken for padding too.
func TestBase64LenLeavesOutTwoPaddingCharactersAtMost(t *testing.T) {
	for s, want := range map[string]int64{"": 0, "AAAA": 3, "AAA=": 2, "AA==": 1, "AAAAAAAA": 6, "AAAAA===": 4, "====": 1} {
		if got := base64Len(s); got != want {
			t.Errorf("base64Len(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestSpokenAnswersSentBackTakesAnIDAsLongAsAModelName: an id as long as maxModelName is one
// the Meter keeps (sawSpokenID), so its recorded length can stand for it; one byte longer is
// none. Mutant: the bound exclusive, the longest id the Meter records never looked up.
func TestSpokenAnswersSentBackTakesAnIDAsLongAsAModelName(t *testing.T) {
	for _, n := range []int{maxModelName, maxModelName + 1} {
		id := strings.Repeat("a", n)
		got := SpokenAnswersSentBack([]byte(`{"messages":[{"role":"assistant","audio":{"id":"` + id + `"}}]}`))
		if want := n <= maxModelName; (len(got) == 1 && got[0] == id) != want {
			t.Errorf("an id of %d bytes: listed %d ids, want it listed %v", n, len(got), want)
		}
	}
}

// pastAsWhole meters answer in format f both ways: read whole by Meter.Body, and read past as
// an answer too large to relay is (proxy's meterOversized): its report alone handed to
// Meter.Body, then what an UnrelayedAnswer measured of it added (AddUnreported).
func pastAsWhole(f Format, answer, report string) (past, whole Result) {
	w := NewMeter(f)
	w.Body([]byte(answer))
	m := NewMeter(f)
	m.Body([]byte(report))
	ua := m.NewUnrelayedAnswer()
	ua.Write([]byte(answer))
	m.AddUnreported(ua)
	return m.Result(), w.Result()
}

// TestUnrelayedAnswerWithAReportIsChargedItsReport: a chat answer read past with a report that
// counts its output (text and audio) is charged that report, as read whole: its text and audio
// came before the report, which counts them, and nothing is estimated on top. Mutants: the
// text or the audio read past taken as streamed after the report, its estimate added.
func TestUnrelayedAnswerWithAReportIsChargedItsReport(t *testing.T) {
	pcm := base64.StdEncoding.EncodeToString(make([]byte, pcmBytesPerSecond)) // a second of raw PCM
	usage := `{"prompt_tokens":10,"completion_tokens":1000,"completion_tokens_details":{"audio_tokens":20}}`
	for name, message := range map[string]string{
		"text":  `{"role":"assistant","content":"` + strings.Repeat("x", 4_000) + `"}`,
		"audio": `{"role":"assistant","content":null,"audio":{"id":"audio_1","data":"` + pcm + `","transcript":""}}`,
	} {
		answer := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":` + message + `,"finish_reason":"stop"}],"usage":` + usage + `}`
		past, whole := pastAsWhole(FormatChat, answer, `{"x":0,"usage":`+usage+`}`)
		if past.Usage != whole.Usage || past.Estimated != whole.Estimated || past.Usage.Output != 1000 {
			t.Errorf("%s: read past %+v (estimated %v), want %+v (estimated %v) as read whole", name, past.Usage, past.Estimated, whole.Usage, whole.Estimated)
		}
	}
}

// TestUnrelayedServerTasksChargeTheOtherChoicesText: a llama.cpp server's whole answer of
// several tasks reports its first task alone; read past, as read whole, the other choices'
// text is charged at its estimate on top, not the first's, which the report counts. Mutant:
// the first choice's text estimated too.
func TestUnrelayedServerTasksChargeTheOtherChoicesText(t *testing.T) {
	usage := `"usage":{"prompt_tokens":10,"completion_tokens":8,"total_tokens":18},"timings":{"predicted_n":8}`
	answer := `{"object":"text_completion","model":"m","choices":[{"text":"` + strings.Repeat("a", 4_000) + `","index":0,"finish_reason":"length"},` +
		`{"text":"` + strings.Repeat("b", 400) + `","index":1,"finish_reason":"length"}],` + usage + `}`
	past, whole := pastAsWhole(FormatCompletions, answer, `{"x":0,`+usage+`}`)
	if want := int64(8 + 400/bytesPerToken); past.Usage != whole.Usage || whole.Usage.Output != want {
		t.Errorf("read past %+v, read whole %+v; want both %d output (the report and the second choice's estimate)", past.Usage, whole.Usage, want)
	}
}
