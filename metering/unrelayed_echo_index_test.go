package metering

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// echoPieces is the output text a completions Meter that was told the call's echoed prompts
// (EchoPrompts) counts of body read past in pieces of size bytes (an UnrelayedAnswer).
func echoPieces(prompts []string, n int64, body string, size int) int64 {
	m := NewMeter(FormatCompletions)
	m.EchoPrompts(prompts, n)
	ua := m.NewUnrelayedAnswer()
	for b := []byte(body); len(b) > 0; b = b[min(len(b), size):] {
		ua.Write(b[:min(len(b), size)])
	}
	m.AddUnreported(ua)
	return m.Result().OutputChars
}

// echoCountedAlike checks that body, an answer to prompts with n choices each and echo, counts
// want bytes of output read whole (Meter.Body) and read past in pieces of every size.
func echoCountedAlike(t *testing.T, name string, prompts []string, n int64, body string, want int64) {
	t.Helper()
	whole := NewMeter(FormatCompletions)
	whole.EchoPrompts(prompts, n)
	whole.Body([]byte(body))
	if got := whole.Result().OutputChars; got != want {
		t.Fatalf("%s: read whole, %d bytes of output; want %d", name, got, want)
	}
	for size := 1; size <= len(body); size++ {
		if got := echoPieces(prompts, n, body, size); got != want {
			t.Errorf("%s in pieces of %d bytes: %d bytes of output; read whole %d", name, size, got, want)
			return
		}
	}
}

// TestUnrelayedAnswerEchoesThePromptItsIndexNames: Meter.Body takes a completions choice's
// echo to be the prompt its "index" names (completionText), else the prompt of its position
// in choices (gjson's key: every element counts, an object or not; an answer of an array of
// answers counts its own choices), and an index whose echo was read already echoes none of
// it again. An UnrelayedAnswer took it to be the prompt of how many choice objects began,
// whatever their index: choices out of index order, a non-object element before a choice, or
// an index named twice, and the same bytes read past were charged less, by up to a prompt's
// length (or more). Read past in pieces of any size, each answer counts what Meter.Body
// counts of it whole, wherever the index stands in its choice (OpenAI writes it after the
// text).
func TestUnrelayedAnswerEchoesThePromptItsIndexNames(t *testing.T) {
	long := strings.Repeat("the quick brown fox ", 15) // 300 bytes
	const short = "Say hello."
	// Each choice's text is its prompt and gen, with its index after the text or before it.
	after := func(index, text string) string {
		return `{"text":"` + text + `","index":` + index + `,"logprobs":null,"finish_reason":"stop"}`
	}
	before := func(index, text string) string {
		return `{"index":` + index + `,"logprobs":null,"text":"` + text + `","finish_reason":"stop"}`
	}
	answer := func(choices ...string) string { return `{"choices":[` + strings.Join(choices, ",") + `]}` }
	for _, tc := range []struct {
		name    string
		prompts []string
		n       int64
		body    string
		want    int64 // bytes of output text, as Meter.Body counts them
	}{
		// The text of each choice echoes the prompt of its position, not of its index: none
		// of it is echo. Read past, the first one's long echo was left out.
		{"index 1 then 0, echoing by position", []string{long, short}, 1,
			answer(after("1", long+" A"), after("0", short+" BB")), int64(len(long) + 2 + len(short) + 3)},
		{"index 1 then 0 before the text, echoing by position", []string{long, short}, 1,
			answer(before("1", long+" A"), before("0", short+" BB")), int64(len(long) + 2 + len(short) + 3)},
		// Each echoes the prompt its index names: read past, both were counted whole.
		{"index 1 then 0, each echoing its own", []string{long, short}, 1,
			answer(after("1", short+" A"), after("0", long+" BB")), 2 + 3},
		// The choice is the second element: it answers the second prompt.
		{"a non-object element before a choice", []string{long, short}, 1,
			answer(`null`, `{"text":"`+long+` A"}`), int64(len(long) + 2)},
		{"a string element before a choice echoing its position", []string{long, short}, 1,
			answer(`"x"`, `{"text":"`+short+` A"}`), 2},
		// Index 0 named twice: its echo was read in the first choice, none is in the second.
		{"an index named twice", []string{long}, 2,
			answer(after("0", long+" A"), after("0", long+" BB")), int64(2 + len(long) + 3)},
		// An index that is no number: the choice's position names the prompt.
		{"an index that is a string", []string{long, short}, 1,
			answer(after(`"1"`, long+" A"), after(`"0"`, short+" BB")), 2 + 3},
		{"a fractional index", []string{long, short}, 1,
			answer(after("1.5", short+" A"), after("0.2", long+" BB")), 2 + 3},
		{"an index past the prompts", []string{long}, 1, answer(after("7", long+" A")), int64(len(long) + 2)},
		{"a negative index", []string{long}, 1, answer(after("-1", long+" A")), int64(len(long) + 2)},
		// An array of whole answers: each answer's choices are counted from 0, and the second
		// answer's choice 0 has no echo left of prompt 0 to leave out.
		{"an array of answers", []string{long, short}, 1,
			`[` + answer(`{"text":"`+long+` A"}`) + `,` + answer(`{"text":"`+short+` BB"}`) + `]`, int64(2 + len(short) + 3)},
		// Choices given as an object: gjson's key is its key, read as a number.
		{"choices as an object", []string{long, short}, 1,
			`{"choices":{"1":{"text":"` + long + ` A"},"0":{"text":"` + long + ` BB"}}}`, int64(len(long) + 2 + 3)},
	} {
		echoCountedAlike(t, tc.name, tc.prompts, tc.n, tc.body, tc.want)
	}
}

// FuzzUnrelayedEcho: any completions answer to a call with echo, read past in pieces, counts
// the output text Meter.Body counts of it whole: prompts that share their first bytes and
// differ in length, answered n choices each.
func FuzzUnrelayedEcho(f *testing.F) {
	f.Add(`{"choices":[{"text":"ab c","index":1},null,{"index":0,"text":"abcdef g"},{"text":"x"}]}`, uint8(1), uint8(3))
	f.Add(`[{"choices":[{"text":"abcdef"}]},{"choices":{"1":{"text":"ab\u0063d"},"0":{"text":"abc","index":2}}}]`, uint8(2), uint8(7))
	f.Add(`{"choices":[{"text":"abcdef","index":0},{"text":"abcdef","index":0},{"text":"ab","index":1.5e0}]}`, uint8(1), uint8(64))
	f.Fuzz(func(t *testing.T, body string, n, size uint8) {
		if !gjson.Valid(string(TrimBody([]byte(body)))) {
			return // read whole, it is refused as cut short (proxy's cutJSON), never metered
		}
		prompts := []string{"abcdef", "ab", "", "abcdef ghij"}
		whole := NewMeter(FormatCompletions)
		whole.EchoPrompts(prompts, int64(n%4)+1)
		whole.Body([]byte(body))
		want := whole.Result().OutputChars
		if got := echoPieces(prompts, int64(n%4)+1, body, int(size)+1); got != want {
			t.Fatalf("in pieces of %d bytes: %d bytes of output; read whole %d", int(size)+1, got, want)
		}
	})
}
