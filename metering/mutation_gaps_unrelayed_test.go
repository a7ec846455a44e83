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

// TestUnrelayedAnswerEchoNamesThePromptAsTheWholeAnswer: a completions answer to a call with
// echo, read past in pieces, leaves out the echo Meter.Body leaves out of it read whole: a
// prompt's escaped line break is the byte it stands for; a choice's first "index" names its
// prompt, a literal that is no number (true, null) names none (its position does); an index
// too long to read names none and leaves all its text output (never less than read whole);
// each answer of an array counts its choices' positions from 0; an index whose echo was read
// in part goes on from there in its next choice, and one whose text parted from its prompt
// echoes none after. Mutants: \n read as n, the last "index" read, true read as 1 and null as
// 0, the long index's position taken, an answer's positions counted on from the last
// answer's, an echo read in part marked read whole, a text that parted from its prompt left
// unmarked.
func TestUnrelayedAnswerEchoNamesThePromptAsTheWholeAnswer(t *testing.T) {
	long := strings.Repeat("the quick brown fox ", 15) // 300 bytes
	const short, lines = "Say hello to the world.", "Line one.\nLine two."
	tooLong := "1." + strings.Repeat("0", 70) // gjson reads 1; longer than a figure read past
	for _, tc := range []struct {
		name    string
		prompts []string
		n       int64
		body    string
		want    int64 // bytes of output text, as Meter.Body counts them
	}{
		{"a prompt with an escaped line break", []string{lines}, 1, `{"choices":[{"text":"Line one.\nLine two. Hi","index":0}]}`, 3},
		{"an index named twice in a choice", []string{long, short}, 1,
			`{"choices":[{"text":"` + long + ` A","index":1,"index":0}]}`, int64(len(long) + 2)},
		{"an index true, an index null", []string{long, short}, 1,
			`{"choices":[{"text":"` + long + ` A","index":true},{"text":"` + short + ` B","index":null}]}`, 2 + 2},
		{"an index too long to read", []string{long, short}, 1,
			`{"choices":[{"text":"` + long + ` A","index":` + tooLong + `}]}`, int64(len(long) + 2)},
		{"an array of answers, the first with two elements", []string{long, short}, 1,
			`[{"choices":[null,{"text":"` + short + ` B"}]},{"choices":[{"text":"` + long + ` C"}]}]`, 2 + 2},
		{"an echo read in part, then the rest", []string{short}, 1,
			`{"choices":[{"text":"Say","index":0},{"text":" hello to the world. Hi","index":0}]}`, 3},
		{"a text that parts from its prompt, then its prompt", []string{short}, 1,
			`{"choices":[{"text":"Sax","index":0},{"text":"Say hello","index":0}]}`, 3 + 9},
	} {
		echoCountedAlike(t, tc.name, tc.prompts, tc.n, tc.body, tc.want)
	}
}

// TestUnrelayedAnswerCutInAnEchoLeavesItOut: a completions answer to a call with echo cut in
// its choice's text (read up to the bound on what is read past) leaves out as much of the echo
// as the same text ended at the cut does read whole. Mutant: the choice cut keeps its echo.
func TestUnrelayedAnswerCutInAnEchoLeavesItOut(t *testing.T) {
	const prompt = "Say hello to the world."
	head, value := `{"choices":[{"text":"`, prompt+" Hello, world! And hello again."
	for _, k := range []int{1, 5, len(prompt), len(prompt) + 1, len(value) - 1} {
		m := NewMeter(FormatCompletions)
		m.EchoPrompts([]string{prompt}, 1)
		ua := m.NewUnrelayedAnswer()
		ua.Write([]byte(head + value[:k]))
		ua.Cut()
		m.AddUnreported(ua)
		w := NewMeter(FormatCompletions)
		w.EchoPrompts([]string{prompt}, 1)
		w.Body([]byte(head + value[:k] + `"}]}`))
		got, want := m.Result().OutputChars, w.Result().OutputChars
		if got != want || want != int64(max(0, k-len(prompt))) {
			t.Errorf("cut %d bytes into the text: %d bytes of output; the text ended there read whole %d, want %d", k, got, want, max(0, k-len(prompt)))
		}
	}
}

// TestUnrelayedServerTaskAnswersReadEachFigureWhole: a figure of an array's answer is read as
// gjson reads it to its last byte: a literal of 64 bytes (the longest read) is a number, and
// white space after a figure ends it, however much of it there is. Mutants: a literal of 64
// bytes read as too long, a space read as part of the literal (the report then read as none
// and the text estimated).
func TestUnrelayedServerTaskAnswersReadEachFigureWhole(t *testing.T) {
	answer := func(usage string) string {
		return `{"choices":[{"text":"aaaa","index":0}],"usage":{` + usage + `}}`
	}
	lit64 := "1." + strings.Repeat("0", 61) + "1"
	for name, body := range map[string]string{
		"a literal of 64 bytes": "[" + answer(`"prompt_tokens":90,"completion_tokens":`+lit64) + "]",
		"spaces after a figure": "[" + answer(`"prompt_tokens":90`+strings.Repeat(" ", 70)+`,"completion_tokens":16`+strings.Repeat(" ", 70)) + "]",
	} {
		if len(lit64) != maxFigureLiteral || !gjson.Valid(body) {
			t.Fatalf("%s: not a valid answer with a literal of %d bytes", name, maxFigureLiteral)
		}
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		want := whole.Result()
		if !want.Reported {
			t.Fatalf("%s read whole: no report", name)
		}
		for _, size := range []int{1, 7, len(body)} {
			if got := readPast(body, size); got.Usage != want.Usage || got.Reported != want.Reported || got.OutputChars != want.OutputChars {
				t.Errorf("%s in pieces of %d: %+v (reported %v, %d chars); read whole %+v (reported %v, %d chars)",
					name, size, got.Usage, got.Reported, got.OutputChars, want.Usage, want.Reported, want.OutputChars)
			}
		}
	}
}

// TestUnrelayedServerOwnShapeCutCountsItsTextOnce: answers in llama.cpp's server's own shape
// cut before their end are charged the text read, once, and no report: an array cut between
// two answers counts the first one's content once; an answer cut after its counts, before its
// end, has no report of its own. Mutants: the ended answer's content counted again at the
// cut, the counts of an answer cut open charged as its report.
func TestUnrelayedServerOwnShapeCutCountsItsTextOnce(t *testing.T) {
	for name, tc := range map[string]struct {
		cut   string
		chars int64
	}{
		"an array cut between answers":   {"[" + llamaOwnFinal(0, "abcd", 90, 16, true) + ",", 4},
		"an answer cut after its counts": {`{"content":"ab","stop":true,"tokens_evaluated":50,"tokens_predicted":2,"timings":{"prompt_n":50`, 2},
	} {
		m := NewMeter(FormatCompletions)
		ua := m.NewUnrelayedAnswer()
		ua.Write([]byte(tc.cut))
		ua.Cut()
		if ua.Answers() {
			m.AddAnswers(ua)
		} else {
			m.AddUnreported(ua)
			m.AddServerReport(ua)
		}
		if got := m.Result(); got.Reported || got.OutputChars != tc.chars {
			t.Errorf("%s: %+v (reported %v, %d chars); want no report, %d chars", name, got.Usage, got.Reported, got.OutputChars, tc.chars)
		}
	}
}
