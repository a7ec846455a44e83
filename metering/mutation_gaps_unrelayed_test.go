package metering

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// Tests for gaps found by mutating UnrelayedAnswer's JSON state machine: each case is an answer
// whose text an UnrelayedAnswer, reading it past in pieces, must count as Meter.Body counts it
// read whole.

// wholeAndPieces checks that body, a valid answer in format f, counts the same bytes of text
// read past in pieces of every size up to 8 and in one piece as read whole, and that it counts
// want bytes read whole (the case is not vacuous).
func wholeAndPieces(t *testing.T, name string, f Format, body string, want int64) {
	t.Helper()
	if !gjson.Valid(string(TrimBody([]byte(body)))) {
		t.Fatalf("%s: not valid JSON", name)
	}
	if got := textWhole(f, body); got != want {
		t.Fatalf("%s read whole: %d bytes of text, want %d", name, got, want)
	}
	for _, size := range []int{1, 2, 3, 5, 8, len(body)} {
		if got := textPieces(f, body, func() int { return size }); got != want {
			t.Errorf("%s (format %d) in pieces of %d: %d bytes of text; read whole %d", name, f, size, got, want)
		}
	}
}

// TestUnrelayedAnswerReadsSurrogatesAsTheWholeAnswer: \u escapes are read as gjson reads them:
// uppercase hex digits too; a surrogate pair only a high half followed at once by a \u low
// half (U+DC00 to U+DFFF) makes, one rune of 4 bytes; a high half followed by any other
// escape, a low half alone or a high half at U+DC00's edge is U+FFFD, 3 bytes each. Mutants:
// uppercase digits skipped, a high half kept waiting past a \n, the low range one off at
// either end, U+DC00 read as a high half.
func TestUnrelayedAnswerReadsSurrogatesAsTheWholeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       int64
	}{
		{"uppercase pair", `\uD83D\uDE00`, 4},
		{"uppercase BMP rune", `\u00E9\u00C9`, 2 + 2},
		{"high half, then \n, then a low half", `\ud83d\n\ude00`, 3 + 1 + 3},
		{"high half, then \", then a low half", `\ud83d\"\ude00`, 3 + 1 + 3},
		{"high half, then U+E000", `\ud83d\ue000`, 3 + 3},
		{"high half, then U+DC00", `\ud83d\udc00`, 4},
		{"high half, then U+DFFF", `\udbff\udfff`, 4},
		{"two low halves", `\udc00\udc01`, 3 + 3},
		{"U+DC00 before a low half", `\udc00\udfff`, 3 + 3},
	} {
		body := `{"choices":[{"message":{"role":"assistant","content":"a` + tc.text + `b"}}]}`
		wholeAndPieces(t, tc.name, FormatChat, body, 2+tc.want)
	}
}

// TestUnrelayedAnswerCutCountsReasoningOnce: a chat answer cut in its message's reasoning,
// given under both names (reasoning_content and reasoning), counts one text, the larger, as
// the same message ended at the cut does read whole. Mutants: the answer cut counts both, or
// the message, the innermost container at the cut, left out of what is taken back.
func TestUnrelayedAnswerCutCountsReasoningOnce(t *testing.T) {
	reasoning := strings.Repeat("think ", 100)
	head := `{"choices":[{"message":{"role":"assistant","reasoning_content":"` + reasoning + `","reasoning":"`
	for _, k := range []int{0, 1, 100, len(reasoning) - 1, len(reasoning)} {
		m := NewMeter(FormatChat)
		ua := m.NewUnrelayedAnswer()
		ua.Write([]byte(head + reasoning[:k]))
		ua.Cut()
		m.AddUnreported(ua)
		want := textWhole(FormatChat, head+reasoning[:k]+`"}}]}`)
		if got := m.Result().OutputChars; got != want || want != int64(len(reasoning)) {
			t.Errorf("cut %d bytes into reasoning: %d bytes of text; the message ended there read whole %d, want %d", k, got, want, len(reasoning))
		}
	}
}

// TestUnrelayedAnswerSkipsTheLeadTrimBodyTrims: an answer led by Unicode white space (a
// no-break space, an em space, an ideographic space) around its byte order mark is read as
// TrimBody trims it, whole; one led by two marks is no JSON object, whole or read past, and
// counts nothing. Mutants: only ASCII white space skipped (the answer read as no object, its
// text unbilled), any number of marks skipped.
func TestUnrelayedAnswerSkipsTheLeadTrimBodyTrims(t *testing.T) {
	answer := `{"choices":[{"message":{"role":"assistant","content":"abc"}}]}`
	wholeAndPieces(t, "unicode space", FormatChat, "\u00a0\u2003\ufeff\u3000\n"+answer, 3)
	twice := "\ufeff\ufeff" + answer
	for _, size := range []int{1, 2, len(twice)} {
		if got, whole := textPieces(FormatChat, twice, func() int { return size }), textWhole(FormatChat, twice); got != 0 || whole != 0 {
			t.Errorf("two byte order marks, in pieces of %d: %d bytes of text, read whole %d; want none", size, got, whole)
		}
	}
}

// TestUnrelayedAnswerEndsEachStringsState: what a string was read as ends with it: the next
// string counted is counted as what its own key makes it. Mutants: a reasoning_content's role
// kept (the content after it taken as reasoning too, and taken back), a compaction's holding
// kept (a block's text after its content held, never counted), a completions answer's
// top-level content kept as the server's own text (an OpenAI-shaped choice's text dropped), an
// echo left unmatched kept (the next choice's text taken for the rest of the prompt).
func TestUnrelayedAnswerEndsEachStringsState(t *testing.T) {
	wholeAndPieces(t, "reasoning, then content", FormatChat,
		`{"choices":[{"message":{"reasoning_content":"abc","content":"xy","reasoning":"abcde"}}]}`, 2+5)
	wholeAndPieces(t, "anthropic content, then text", FormatAnthropic,
		`{"content":[{"content":"no","text":"abc"},{"type":"text","content":"no","text":"de"}]}`, 3+2)
	wholeAndPieces(t, "completions content, then choices", FormatCompletions,
		`{"content":"no","choices":[{"text":"yes","index":0}]}`, 3)
	const prompt = "Say hello to the world."
	body := `{"choices":[{"text":"Say","index":0},{"text":" hello","index":1}]}`
	w := NewMeter(FormatCompletions)
	w.EchoPrompts([]string{prompt}, 1)
	w.Body([]byte(body))
	if got := w.Result().OutputChars; got != 6 {
		t.Fatalf("echo cut short, read whole: %d bytes of output, want 6 (the second choice has no prompt)", got)
	}
	for size := 1; size <= len(body); size++ {
		m := NewMeter(FormatCompletions)
		m.EchoPrompts([]string{prompt}, 1)
		ua := m.NewUnrelayedAnswer()
		for b := []byte(body); len(b) > 0; b = b[min(len(b), size):] {
			ua.Write(b[:min(len(b), size)])
		}
		m.AddUnreported(ua)
		if got := m.Result().OutputChars; got != 6 {
			t.Errorf("echo cut short, in pieces of %d: %d bytes of output; read whole 6", size, got)
		}
	}
}

// TestUnrelayedAnswerReadsNoKeyLongerThanItsOwn: a key longer than the longest one read
// ("reasoning_content", 17 bytes) matches none, though it begins with one. Mutant: a longer key
// read as its first 17 bytes, its value counted as reasoning.
func TestUnrelayedAnswerReadsNoKeyLongerThanItsOwn(t *testing.T) {
	wholeAndPieces(t, "long keys", FormatChat,
		`{"choices":[{"message":{"reasoning_contents":"no","reasoning_content_":"no","reasoning_content":"ab"}}]}`, 2)
}

// TestUnrelayedServerTasksFirstChoiceIsTheFirstObject: a llama.cpp server's report of several
// tasks counts its first choice object's text alone, as Meter.Body reads it (choiceObjects): a
// choice that is no object (an empty list) is none. Mutant: a list counted as a choice, the
// first object's text estimated on top of the report.
func TestUnrelayedServerTasksFirstChoiceIsTheFirstObject(t *testing.T) {
	usage := `"usage":{"prompt_tokens":10,"completion_tokens":8,"total_tokens":18},"timings":{"predicted_n":8}`
	answer := `{"object":"text_completion","model":"m","choices":[[],{"text":"` + strings.Repeat("a", 4_000) + `","finish_reason":"length"},` +
		`{"text":"` + strings.Repeat("b", 400) + `","finish_reason":"length"}],` + usage + `}`
	past, whole := pastAsWhole(FormatCompletions, answer, `{"x":0,`+usage+`}`)
	if want := int64(8 + 400/bytesPerToken); past.Usage != whole.Usage || whole.Usage.Output != want {
		t.Errorf("read past %+v, read whole %+v; want both %d output (the report and the second choice's estimate)", past.Usage, whole.Usage, want)
	}
}
