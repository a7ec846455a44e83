package metering

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// llamaOwnFinal is the last event of a llama.cpp server task, or its whole answer, in the
// server's own shape, which its builds before PR 10974 (December 2024) answered /v1/completions
// with (send_final_response; key order as the server writes them): its text in content (""
// when streamed), stop true, its answer's n_decoded and its prompt's n_prompt_tokens, and its
// index in a batch. counts false leaves the two counts out.
func llamaOwnFinal(index int, content string, prompt, predicted int64, counts bool) string {
	figures := ""
	if counts {
		figures = fmt.Sprintf(`"tokens_predicted":%d,"tokens_evaluated":%d,`, predicted, prompt)
	}
	return fmt.Sprintf(`{"content":%q,"id_slot":0,"stop":true,"model":"m",%s"generation_settings":{"n_ctx":4096,"n_predict":-1,"model":"m"},`+
		`"prompt":"say something long","has_new_line":false,"truncated":false,"stopped_eos":true,"stopped_word":false,"stopped_limit":false,"stopping_word":"",`+
		`"tokens_cached":%d,"timings":{"prompt_n":%d,"prompt_ms":12.5,"predicted_n":%d,"predicted_ms":80.1},"index":%d}`,
		content, figures, prompt+predicted, prompt, predicted, index)
}

// llamaOwnPartial is a streamed event of a llama.cpp server task in the server's own shape
// (send_partial_response): one piece of its text.
func llamaOwnPartial(index int, content string) Event {
	return data(fmt.Sprintf(`{"content":%q,"stop":false,"id_slot":0,"multimodal":false,"index":%d}`, content, index))
}

// TestServerTaskOwnShapeIsCharged: llama.cpp's server, in its builds before PR 10974, answered
// /v1/completions in its own shape, whole or streamed: content, stop, and on the whole answer or
// the last event the task's tokens_evaluated and tokens_predicted; no choices, no usage. Read as
// an OpenAI-shaped answer, it was none: the call was charged its prompt's estimate and none of
// its output. Its counts are its report now (tokens_evaluated the prompt, tokens_predicted the
// output), and without them its content is there for the estimate.
func TestServerTaskOwnShapeIsCharged(t *testing.T) {
	text := strings.Repeat("w", 40)
	m := NewMeter(FormatCompletions)
	m.Body([]byte(llamaOwnFinal(0, text, 90, 16, true)))
	if got, want := m.Result(), (pricing.Usage{Input: 90, Output: 16}); got.Usage != want || !got.Reported || got.Estimated || got.Model != "m" || got.OutputChars != 40 {
		t.Errorf("whole: got %+v (reported %v, estimated %v, model %q, %d chars), want %+v, reported, not estimated, model m, 40 chars",
			got.Usage, got.Reported, got.Estimated, got.Model, got.OutputChars, want)
	}
	m = NewMeter(FormatCompletions)
	m.Body([]byte(llamaOwnFinal(0, text, 90, 16, false)))
	if got := m.Result(); got.Reported || got.OutputChars != 40 {
		t.Errorf("whole without counts: got %+v (reported %v, %d chars), want no report and 40 chars for the estimate", got.Usage, got.Reported, got.OutputChars)
	}

	stream := meterEvents(FormatCompletions, llamaOwnPartial(0, "aaaa"), llamaOwnPartial(0, "bbbb"), data(llamaOwnFinal(0, "", 90, 16, true)))
	if want := (pricing.Usage{Input: 90, Output: 16}); stream.Usage != want || !stream.Reported || stream.Estimated || stream.OutputChars != 8 {
		t.Errorf("stream: got %+v (reported %v, estimated %v, %d chars), want %+v, reported, not estimated, 8 chars",
			stream.Usage, stream.Reported, stream.Estimated, stream.OutputChars, want)
	}
	cut := meterEvents(FormatCompletions, llamaOwnPartial(0, "aaaa"), llamaOwnPartial(0, "bbbb"))
	if cut.Reported || cut.OutputChars != 8 {
		t.Errorf("stream cut before its last event: got %+v (reported %v, %d chars), want no report and 8 chars for the estimate", cut.Usage, cut.Reported, cut.OutputChars)
	}

	// A chat answer in that shape is none: the server's chat route was OpenAI-shaped.
	m = NewMeter(FormatChat)
	m.Body([]byte(llamaOwnFinal(0, text, 90, 16, true)))
	if got := m.Result(); got.Reported || got.OutputChars != 0 {
		t.Errorf("chat: got %+v (reported %v, %d chars), want nothing read", got.Usage, got.Reported, got.OutputChars)
	}
}

// TestServerTaskOwnShapeOfABatchChargesEveryTask: the same builds ran each prompt of a batch as
// a task of its own, each reporting its own prompt and output alone: whole, they answered a JSON
// array of such answers; streamed, each task's events carried its index, and each task ended
// with its own counts. Every task's report is charged, summed and marked estimated; a prompt
// whose task did not end is charged its estimate, and its text streamed so far too.
func TestServerTaskOwnShapeOfABatchChargesEveryTask(t *testing.T) {
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 80)
	m := NewMeter(FormatCompletions)
	m.BatchPrompts([]int64{100, 200}, 1)
	m.Body([]byte("[" + llamaOwnFinal(0, a, 90, 16, true) + ",\n" + llamaOwnFinal(1, b, 210, 12, true) + "]"))
	if got, want := m.Result(), (pricing.Usage{Input: 90 + 210, Output: 16 + 12}); got.Usage != want || !got.Reported || !got.Estimated || got.Model != "m" || got.OutputChars != 120 {
		t.Errorf("whole batch: got %+v (reported %v, estimated %v, model %q, %d chars), want %+v, reported and estimated, model m, 120 chars",
			got.Usage, got.Reported, got.Estimated, got.Model, got.OutputChars, want)
	}
	m = NewMeter(FormatCompletions)
	m.Body([]byte("[" + llamaOwnFinal(0, a, 90, 16, true) + "," + llamaOwnFinal(1, b, 210, 12, false) + "]"))
	if got := m.Result(); got.Reported || got.OutputChars != 120 {
		t.Errorf("whole batch, one answer without counts: got %+v (reported %v, %d chars), want no report and 120 chars for the estimate", got.Usage, got.Reported, got.OutputChars)
	}

	ended := meterBatch([]int64{100, 200}, 1, llamaOwnPartial(0, "aaaa"), llamaOwnPartial(1, "bbbbbbbb"),
		data(llamaOwnFinal(1, "", 210, 12, true)), data(llamaOwnFinal(0, "", 90, 16, true)))
	if want := (pricing.Usage{Input: 90 + 210, Output: 16 + 12}); ended.Usage != want || !ended.Estimated {
		t.Errorf("streamed batch: got %+v (estimated %v), want %+v, every task's report, estimated", ended.Usage, ended.Estimated, want)
	}
	cut := meterBatch([]int64{100, 200}, 1, llamaOwnPartial(0, "aaaa"), llamaOwnPartial(1, "bbbbbbbb"),
		data(llamaOwnFinal(0, "", 90, 16, true)), llamaOwnPartial(1, "bbbb"))
	if want := (pricing.Usage{Input: 90 + 200, Output: 16 + EstimateOutputTokens(8+4)}); cut.Usage != want || !cut.Estimated {
		t.Errorf("streamed batch cut after one task: got %+v (estimated %v), want %+v, its report, the other prompt's estimate and text", cut.Usage, cut.Estimated, want)
	}
}

// readPast meters body as proxy's meterOversized meters an answer read past to its end without
// a usage at its end: its text and audio (AddUnreported), an array's reports (AddAnswers), or
// the answer's own counts in llama.cpp's server's own shape (AddServerReport), written to an
// UnrelayedAnswer in pieces of size.
func readPast(body string, size int) Result {
	m := NewMeter(FormatCompletions)
	ua := m.NewUnrelayedAnswer()
	for b := []byte(body); len(b) > 0; b = b[min(len(b), size):] {
		ua.Write(b[:min(len(b), size)])
	}
	if ua.Answers() {
		m.AddAnswers(ua)
	} else {
		m.AddUnreported(ua)
		m.AddServerReport(ua)
	}
	return m.Result()
}

// TestUnrelayedServerTaskOwnShapeIsChargedAsWhole: an answer in llama.cpp's server's own shape
// too large to relay was read past for a usage it has none of, and its content was no text the
// read-past counted: it was charged its prompt's estimate and no output. Read past, alone or as
// an array of them, it is charged as read whole, however it is cut into pieces; cut in its
// content, the content read is its text.
func TestUnrelayedServerTaskOwnShapeIsChargedAsWhole(t *testing.T) {
	text := strings.Repeat("w", 40) + `\"\u00e9`
	for name, body := range map[string]string{
		"one":                llamaOwnFinal(0, text, 90, 16, true),
		"one without counts": llamaOwnFinal(0, text, 90, 16, false),
		"batch":              " [" + llamaOwnFinal(0, text, 90, 16, true) + ",\n" + llamaOwnFinal(1, "bb", 210, 12, true) + "]",
		"batch, one without": "[" + llamaOwnFinal(0, text, 90, 16, true) + "," + llamaOwnFinal(1, "bb", 210, 12, false) + "]",
	} {
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		want := whole.Result()
		if want.OutputChars == 0 {
			t.Fatalf("%s: read whole, no text", name)
		}
		for _, size := range []int{1, 3, 7, len(body)} {
			if got := readPast(body, size); got.Usage != want.Usage || got.Reported != want.Reported || got.Estimated != want.Estimated || got.OutputChars != want.OutputChars {
				t.Errorf("%s in pieces of %d: %+v (reported %v, estimated %v, %d chars); read whole %+v (reported %v, estimated %v, %d chars)",
					name, size, got.Usage, got.Reported, got.Estimated, got.OutputChars, want.Usage, want.Reported, want.Estimated, want.OutputChars)
			}
		}
	}
	if got, want := readPast(llamaOwnFinal(0, "abcd", 90, 16, true), 5), (pricing.Usage{Input: 90, Output: 16}); got.Usage != want || !got.Reported {
		t.Errorf("one read past: %+v (reported %v), want %+v", got.Usage, got.Reported, want)
	}

	// Cut in its content: the content read is its text, and there is no report.
	m := NewMeter(FormatCompletions)
	ua := m.NewUnrelayedAnswer()
	ua.Write([]byte(`{"content":"abcdef`))
	ua.Cut()
	m.AddUnreported(ua)
	m.AddServerReport(ua)
	if got := m.Result(); got.Reported || got.OutputChars != 6 {
		t.Errorf("cut in its content: reported %v, %d chars; want no report, 6 chars", got.Reported, got.OutputChars)
	}
}

// TestUnrelayedServerTaskOwnShapeMatchesTheWholeRead: answers built at random from the keys of
// llama.cpp's server's own shape and OpenAI's (figures as numbers, fractions, negatives, null;
// a stop no boolean; content no string; keys repeated), alone or in arrays, read past in pieces
// of random sizes, are charged as read whole.
func TestUnrelayedServerTaskOwnShapeMatchesTheWholeRead(t *testing.T) {
	parts := []string{`"content":"ab"`, `"content":"c\"d\u00e9"`, `"content":5`, `"content":{"a":"xy"}`, `"stop":true`, `"stop":false`, `"stop":"yes"`,
		`"tokens_evaluated":12`, `"tokens_evaluated":1.5e1`, `"tokens_evaluated":-4`, `"tokens_evaluated":null`, `"tokens_predicted":3`, `"tokens_predicted":2.5`,
		`"tokens_predicted":[1]`, `"choices":[{"text":"ab","index":0}]`, `"timings":{"predicted_n":3}`, `"model":"m"`, `"index":1`,
		`"generation_settings":{"content":"no","stop":true,"tokens_predicted":99}`}
	usages := []string{`"usage":{"prompt_tokens":12,"completion_tokens":3}`, `"usage":null`}
	rng := rand.New(rand.NewPCG(3, 4))
	answer := func(array bool) string {
		var kv []string
		for range rng.IntN(6) + 1 {
			if array && rng.IntN(8) == 0 {
				kv = append(kv, usages[rng.IntN(len(usages))]) // read past alone, a usage is the tail's (meterOversized)
				continue
			}
			kv = append(kv, parts[rng.IntN(len(parts))])
		}
		return "{" + strings.Join(kv, ",") + "}"
	}
	for range 5000 {
		body := answer(false)
		if rng.IntN(2) == 0 {
			var el []string
			for range rng.IntN(3) + 1 {
				el = append(el, answer(true))
			}
			body = " [" + strings.Join(el, " ,\n") + "] "
		}
		if !gjson.Valid(body) {
			t.Fatalf("not valid JSON: %s", body)
		}
		whole := NewMeter(FormatCompletions)
		whole.Body([]byte(body))
		want := whole.Result()
		size := rng.IntN(9) + 1
		if got := readPast(body, size); got.Usage != want.Usage || got.Reported != want.Reported || got.Estimated != want.Estimated || got.OutputChars != want.OutputChars {
			t.Fatalf("%s\nin pieces of %d: %+v (reported %v, estimated %v, %d chars); read whole %+v (reported %v, estimated %v, %d chars)",
				body, size, got.Usage, got.Reported, got.Estimated, got.OutputChars, want.Usage, want.Reported, want.Estimated, want.OutputChars)
		}
	}
}
