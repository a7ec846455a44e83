package metering

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// TestServerTaskAnswersArrayIsSummed: a llama.cpp server built before it merged a batch's
// answers answers a /v1/completions batch, not streamed, with a JSON array of whole answers,
// each one prompt's task with its own usage. It was read as no answer: no report, and none of
// its text. Every answer's report counts, summed, the sum marked estimated; without a report in
// each, the text of all is there for the estimate. A chat answer is never such an array.
func TestServerTaskAnswersArrayIsSummed(t *testing.T) {
	answer := func(index int, usage string) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"m","system_fingerprint":"b1","object":"text_completion"%s,"id":"chatcmpl-l"}`,
			strings.Repeat("w", 40), index, usage)
	}
	usage := func(prompt, completion int64) string {
		return fmt.Sprintf(`,"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d},"timings":{"prompt_n":%d,"predicted_n":%d}`,
			completion, prompt, prompt+completion, prompt, completion)
	}
	m := NewMeter(FormatCompletions)
	m.Body([]byte(" [" + answer(0, usage(90, 16)) + "," + answer(1, usage(210, 12)) + "]\n"))
	if got, want := m.Result(), (pricing.Usage{Input: 90 + 210, Output: 16 + 12}); got.Usage != want || !got.Reported || !got.Estimated || got.Model != "m" || got.OutputChars != 80 {
		t.Errorf("two answers: got %+v (reported %v, estimated %v, model %q, %d chars), want %+v, reported and estimated, model m, 80 chars",
			got.Usage, got.Reported, got.Estimated, got.Model, got.OutputChars, want)
	}

	m = NewMeter(FormatCompletions)
	m.Body([]byte("[" + answer(0, usage(90, 16)) + "," + answer(1, "") + "]"))
	if got := m.Result(); got.Reported || got.OutputChars != 80 {
		t.Errorf("one answer without a report: got %+v (reported %v, %d chars), want no report and all 80 chars for the estimate", got.Usage, got.Reported, got.OutputChars)
	}

	m = NewMeter(FormatChat)
	m.Body([]byte(`[{"choices":[{"index":0,"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}]`))
	if got := m.Result(); got.Reported || got.OutputChars != 0 {
		t.Errorf("chat array: got %+v (reported %v), want nothing read", got.Usage, got.Reported)
	}
}

// TestServerTaskAnswersSumIsAReportOfTwoFigures: the sum of an array's reports is applied as a
// usage of its prompt_tokens, their cached part and completion_tokens alone would be read
// (openAIUsage), without writing one out and reading it back: the same report, the same zeros
// read as none.
func TestServerTaskAnswersSumIsAReportOfTwoFigures(t *testing.T) {
	for _, sum := range [][3]int64{{300, 0, 28}, {300, 280, 28}, {0, 0, 5}, {7, 0, 0}, {7, 7, 0}, {0, 0, 0},
		{pricing.MaxTokens, pricing.MaxTokens, pricing.MaxTokens}} {
		direct := NewMeter(FormatCompletions)
		direct.summedReport(sum[0], sum[1], sum[2])
		read := NewMeter(FormatCompletions)
		reported := read.openAIUsage(gjson.Parse(fmt.Sprintf(`{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d},"completion_tokens":%d}`, sum[0], sum[1], sum[2])))
		if got, want := direct.Result(), read.Result(); got.Usage != want.Usage || got.Reported != want.Reported ||
			got.PromptMissing != want.PromptMissing || direct.summedAnswers != reported {
			t.Errorf("sum %v: applied %+v (reported %v, summed %v); read %+v (reported %v)", sum, got.Usage, got.Reported, direct.summedAnswers, want.Usage, reported)
		}
	}
}

// TestUnrelayedServerTaskAnswersAreSummedAsWhole: an older llama.cpp build's array of whole
// answers to a batch, too large to relay and read past in pieces, was read as no answer at all
// (no JSON object): none of its text, none of its answers' reports, where read whole every
// report is summed (taskAnswers). Read past, it is charged as read whole, however it is cut
// into pieces: each answer's figures read as gjson reads them (the first "usage", its first
// figures, numbers alone), an element that is no answer passed over, and without a report in
// each, the text of all for the estimate.
func TestUnrelayedServerTaskAnswersAreSummedAsWhole(t *testing.T) {
	answer := func(text, usage string) string {
		return `{"choices":[{"text":"` + text + `","index":0,"logprobs":null,"finish_reason":"length"}],"model":"m","object":"text_completion"` + usage + `}`
	}
	bodies := map[string]string{
		"every report": "\ufeff [" + answer("aaaa", `,"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},"timings":{"predicted_n":16}`) + ",\n " +
			answer("bbbbbbbb", `,"usage":{"prompt_tokens":210 , "completion_tokens":12.7e0,"total_tokens":222}`) + "]\n",
		"first keys": "[" + answer("a", `,"usage":{"prompt_tokens":9,"prompt_tokens":1000,"completion_tokens":-3,"completion_tokens":1000},"usage":{"prompt_tokens":5000}`) + "," +
			answer("b", `,"usage":{"prompt_tokens":1e1,"x":{"prompt_tokens":"no"},"completion_tokens":2}`) + `,7,"x",null,[{"usage":{"prompt_tokens":1000,"completion_tokens":1000}}]]`,
		"one without a report": "[" + answer("aaaa", `,"usage":{"completion_tokens":16,"prompt_tokens":90}`) + "," + answer("bb", "") + "]",
		"a figure as a string": "[" + answer("aaaa", `,"usage":{"completion_tokens":16,"prompt_tokens":90}`) + "," + answer("bb", `,"usage":{"completion_tokens":"2","prompt_tokens":9}`) + "]",
		"a figure null":        "[" + answer("aaaa", `,"usage":{"completion_tokens":null,"prompt_tokens":90}`) + "]",
		"usage no object":      "[" + answer("aaaa", `,"usage":[{"completion_tokens":1,"prompt_tokens":90}]`) + "]",
		"a figure an object":   "[" + answer("aaaa", `,"usage":{"completion_tokens":{"n":1},"prompt_tokens":90}`) + "]",
		"zeros":                "[" + answer("", `,"usage":{"completion_tokens":0,"prompt_tokens":0}`) + "]",
		"no answers":           `[1,"two",[3]]`,
		"empty":                `[]`,
		"choices twice":        `[{"choices":[{"text":"ab"}],"choices":[{"text":"no"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}]`,
		// llama.cpp's timings.cache_n, the cached part of each answer's prompt (answerCached):
		// read in the first timings alone, its first cache_n, a number alone, within the prompt.
		"cache_n": "[" + answer("aaaa", `,"usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},"timings":{"cache_n":80,"prompt_n":10,"predicted_n":16}`) + ",\n " +
			answer("bbbbbbbb", `,"timings":{"prompt_n":10 ,"cache_n" : 2.0e2},"usage":{"prompt_tokens":210,"completion_tokens":12}`) + "]",
		"cache_n first keys": "[" + answer("a", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"x":{"cache_n":5},"cache_n":30,"cache_n":70},"timings":{"cache_n":80}`) + "," +
			answer("b", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":[{"cache_n":80}],"timings":{"cache_n":80}`) + "," +
			answer("c", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"x":1},"timings":{"cache_n":80}`) + "]",
		"cache_n not a count": "[" + answer("a", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":"80"}`) + "," +
			answer("b", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":{"n":80}}`) + "," +
			answer("c", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":-80}`) + "," +
			answer("d", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":null}`) + "]",
		"cache_n above the prompt": "[" + answer("a", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":1e30}`) + "," +
			answer("b", `,"usage":{"prompt_tokens":-5,"completion_tokens":1},"timings":{"cache_n":80}`) + "]",
		"cache_n of an answer in the server's own shape": `[{"content":"ab","stop":true,"tokens_evaluated":50,"tokens_predicted":2,"timings":{"cache_n":40}},` +
			answer("b", `,"usage":{"prompt_tokens":90,"completion_tokens":1},"timings":{"cache_n":80}`) + "]",
	}
	for name, body := range bodies {
		if !gjson.Valid(string(TrimBody([]byte(body)))) {
			t.Fatalf("%s: not valid JSON", name)
		}
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		want := whole.Result()
		for _, size := range []int{1, 2, 7, len(body)} {
			m := NewMeter(FormatCompletions)
			ua := m.NewUnrelayedAnswer()
			for b := []byte(body); len(b) > 0; b = b[min(len(b), size):] {
				ua.Write(b[:min(len(b), size)])
			}
			if !ua.Answers() || ua.Open() {
				t.Fatalf("%s: not read as an array of answers that ended (answers %v, open %v)", name, ua.Answers(), ua.Open())
			}
			m.AddAnswers(ua)
			if got := m.Result(); got.Usage != want.Usage || got.Reported != want.Reported || got.Estimated != want.Estimated || got.OutputChars != want.OutputChars {
				t.Errorf("%s in pieces of %d: %+v (reported %v, estimated %v, %d chars); read whole %+v (reported %v, estimated %v, %d chars)",
					name, size, got.Usage, got.Reported, got.Estimated, got.OutputChars, want.Usage, want.Reported, want.Estimated, want.OutputChars)
			}
		}
	}
	// Not vacuous: read whole, the reports are summed where each answer has one.
	for name, want := range map[string]pricing.Usage{"every report": {Input: 300, Output: 28}, "first keys": {Input: 19, Output: 2},
		"cache_n": {Input: 20, CacheRead: 280, Output: 28}, "cache_n first keys": {Input: 60 + 90 + 90, CacheRead: 30, Output: 3},
		"cache_n not a count": {Input: 360, Output: 4}, "cache_n above the prompt": {CacheRead: 90, Output: 2},
		"cache_n of an answer in the server's own shape": {Input: 50 + 10, CacheRead: 80, Output: 3}} {
		m := NewMeter(FormatCompletions)
		m.Body([]byte(bodies[name]))
		if got := m.Result(); got.Usage != want || !got.Reported {
			t.Errorf("%s read whole: %+v (reported %v), want %+v", name, got.Usage, got.Reported, want)
		}
	}

	// Cut, it is open and charges no report, only the text read; a chat answer is no array.
	m := NewMeter(FormatCompletions)
	ua := m.NewUnrelayedAnswer()
	body := bodies["every report"]
	ua.Write([]byte(body[:strings.Index(body, "bbbb")+2]))
	ua.Cut()
	m.AddAnswers(ua)
	if got := m.Result(); !ua.Open() || got.Reported || got.OutputChars != 6 {
		t.Errorf("cut in the second answer: open %v, reported %v, %d chars; want open, no report, 6 chars", ua.Open(), got.Reported, got.OutputChars)
	}
	// A figure whose literal is longer than any count a server writes is read as none: the text
	// is estimated (read whole, gjson reads it as 10).
	m = NewMeter(FormatCompletions)
	ua = m.NewUnrelayedAnswer()
	ua.Write([]byte("[" + answer("aaaa", `,"usage":{"completion_tokens":1.0000000000000000000000000000000000000000000000000000000000000000e1,"prompt_tokens":90}`) + "]"))
	if m.AddAnswers(ua); m.Result().Reported || m.Result().OutputChars != 4 {
		t.Errorf("a figure too long: %+v (reported %v), want no report and the text for the estimate", m.Result().Usage, m.Result().Reported)
	}
	if ua := NewMeter(FormatChat).NewUnrelayedAnswer(); func() bool { ua.Write([]byte(bodies["every report"])); return ua.Answers() }() {
		t.Errorf("a chat answer read as an array of answers")
	}
}

// TestUnrelayedServerTaskAnswersMatchTheWholeRead: arrays of whole answers built at random from
// answers' keys in every shape a report can take (figures as numbers, strings, null, lists,
// objects, negative, as exponents; a usage null, repeated, escaped, nested off the path; elements
// that are no answer), read past in pieces of random sizes, are charged as read whole.
func TestUnrelayedServerTaskAnswersMatchTheWholeRead(t *testing.T) {
	parts := []string{`"choices":[{"text":"ab","index":0}]`, `"choices":[{"text":"c\"d\u00e9","index":1},{"text":"e"}]`, `"choices":{"a":{"text":"xy"}}`,
		`"usage":{"prompt_tokens":12,"completion_tokens":3}`, `"usage":{"completion_tokens":7,"prompt_tokens":1.5e1,"total_tokens":9}`,
		`"usage":{"prompt_tokens":"4","completion_tokens":2}`, `"usage":null`, `"usage":{"prompt_tokens":[1],"completion_tokens":{"a":1}}`,
		`"usage":{"prompt_tokens":-4,"completion_tokens":2}`, `"timings":{"predicted_n":3}`, `"model":"m"`, `"x":[1,{"usage":{"prompt_tokens":99,"completion_tokens":99}}]`,
		`"usage":{ "prompt_tokens" : 5 , "completion_tokens" : 6 }`, `"u\u0073age":{"prompt_tokens":8,"completion_tokens":8}`, `"usage":{"prompt_tokens":true,"completion_tokens":1}`,
		// llama.cpp's cache_n, the cached part of the prompt (answerCached).
		`"timings":{"cache_n":10,"predicted_n":3}`, `"timings":{ "cache_n" : 1e2 }`, `"timings":{"cache_n":"4"}`, `"timings":{"cache_n":-3}`,
		`"timings":[{"cache_n":5}]`, `"timings":{"x":{"cache_n":9},"cache_n":[1]}`, `"t\u0069mings":{"cache_n":6}`, `"timings":{"c\u0061che_n":7}`,
		`"stop":true`, `"tokens_evaluated":20`, `"tokens_predicted":2`}
	elems := []string{`7`, `"s"`, `null`, `[{"usage":{"prompt_tokens":1,"completion_tokens":1}}]`, `{}`}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var el []string
		for range rng.IntN(4) + 1 {
			if rng.IntN(5) == 0 {
				el = append(el, elems[rng.IntN(len(elems))])
				continue
			}
			var kv []string
			for range rng.IntN(4) + 1 {
				kv = append(kv, parts[rng.IntN(len(parts))])
			}
			el = append(el, "{"+strings.Join(kv, ",")+"}")
		}
		body := " [" + strings.Join(el, " ,\n") + "] "
		if !gjson.Valid(body) {
			t.Fatalf("not valid JSON: %s", body)
		}
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		want := whole.Result()
		size := rng.IntN(9) + 1
		m := NewMeter(FormatCompletions)
		ua := m.NewUnrelayedAnswer()
		for b := []byte(body); len(b) > 0; b = b[min(len(b), size):] {
			ua.Write(b[:min(len(b), size)])
		}
		m.AddAnswers(ua)
		got := m.Result()
		if got.Usage != want.Usage || got.Reported != want.Reported || got.Estimated != want.Estimated || got.OutputChars != want.OutputChars {
			t.Fatalf("%s\nin pieces of %d: %+v (reported %v, estimated %v, %d chars); read whole %+v (reported %v, estimated %v, %d chars)", body, size, got.Usage, got.Reported, got.Estimated, got.OutputChars, want.Usage, want.Reported, want.Estimated, want.OutputChars)
		}
	}
}
