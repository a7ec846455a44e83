package metering

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// The numbers an UnrelayedAnswer reads itself: the usage figures of each answer of an array of
// whole answers (Meter.taskAnswers) and of an answer in llama.cpp's server's own shape, and a
// completions choice's index.

// answerReport is what the usage of one whole answer of an array counts, or the sum of such
// usages: its prompt_tokens and its completion_tokens, and of each whether it was a number;
// its timings.cache_n when a number (cacheN), and in a sum the cached part of the prompts
// (cached, Meter.answerCached).
// For an answer in llama.cpp's server's own shape (Meter.serverAnswer), of the array or the
// answer itself: whether it had choices, a usage, and a boolean stop, its tokens_evaluated and
// tokens_predicted (own), and the bytes of its content (ownText), text only when it is one.
type answerReport struct {
	prompt, completion         int64
	promptSeen, completionSeen bool
	cacheN                     reportedFigure
	cached                     int64
	choices, usage, stop       bool
	own                        [2]reportedFigure
	ownText                    int64
}

// serverOwn reports whether the answer read is in llama.cpp's server's own shape, as
// serverFields.own and openAIObject read one: no choices, no usage, and a boolean stop.
func (r answerReport) serverOwn() bool { return !r.choices && !r.usage && r.stop }

// maxFigureLiteral bounds the literal of a usage figure an UnrelayedAnswer reads: a longer one
// (no count a server writes; gjson reads it whole) is read as no number, as a report without
// the figure, and the array's text is estimated.
const maxFigureLiteral = 64

// Which figure of an element's usage is being read.
const (
	figureNone uint8 = iota
	figurePrompt
	figureCompletion
	// An answer's own figures in llama.cpp's server's own shape: tokens_evaluated,
	// tokens_predicted, and its stop (true or false).
	figureOwnPrompt
	figureOwnCompletion
	figureStop
	figureCacheN // its timings.cache_n, llama.cpp's server's cached part of the prompt
	figureIndex  // a completions choice's index
)

// literalFigure is the figure a literal of role is read as (figureEnds), figureNone for a
// role read as no figure.
func literalFigure(role uint8) uint8 {
	switch role {
	case roleFigurePrompt:
		return figurePrompt
	case roleFigureCompletion:
		return figureCompletion
	case roleOwnPrompt:
		return figureOwnPrompt
	case roleOwnCompletion:
		return figureOwnCompletion
	case roleFigureCacheN:
		return figureCacheN
	case roleStop:
		return figureStop
	case roleIndex:
		return figureIndex
	}
	return figureNone
}

// figureEnds reads the literal of the usage figure just read as gjson reads it: a number, or
// none (true, false, null; one too long to be a count).
func (b *UnrelayedAnswer) figureEnds() {
	fig := b.figure
	b.figure = figureNone
	if b.litLen > len(b.literal) {
		if fig == figureIndex {
			// A number gjson reads whole, but not this: whatever prompt it names, the text
			// counts whole, never less than read whole.
			b.choice.indexed = indexTooLong
		}
		return
	}
	v := gjson.Parse(string(b.literal[:b.litLen]))
	switch fig {
	case figureStop:
		b.element.stop = v.Type == gjson.True || v.Type == gjson.False
		return
	case figureIndex:
		if v.Type == gjson.Number {
			b.choice.index, b.choice.indexed = v.Int(), indexNumber
		}
		return
	}
	if v.Type != gjson.Number {
		return
	}
	switch fig {
	case figureOwnPrompt, figureOwnCompletion:
		// As the Meter reads them: an answer of an array as taskAnswers (answerFigure), the
		// answer itself as serverAnswer (tokenCount).
		n, _ := tokenCount(v)
		if b.answers {
			n = answerFigure(v)
		}
		b.element.own[fig-figureOwnPrompt] = reportedFigure{n: n, seen: true}
	case figurePrompt:
		b.element.prompt, b.element.promptSeen = answerFigure(v), true
	case figureCompletion:
		b.element.completion, b.element.completionSeen = answerFigure(v), true
	case figureCacheN:
		b.element.cacheN = reportedFigure{n: v.Int(), seen: true}
	}
}

// answerEnds adds the report of the answer of an array just read to the sum, as taskAnswers
// sums them: an answer without a number for both figures leaves the array unreported.
func (b *UnrelayedAnswer) answerEnds() {
	b.answered++
	b.ownEnds()
	e := b.element
	if e.serverOwn() {
		// In llama.cpp's server's own shape: its report is its own two figures.
		e.prompt, e.promptSeen = e.own[0].n, e.own[0].seen
		e.completion, e.completionSeen = e.own[1].n, e.own[1].seen
	}
	if !e.promptSeen || !e.completionSeen {
		b.unreported = true
		return
	}
	b.summed.prompt = min(pricing.MaxTokens, b.summed.prompt+max(0, e.prompt))
	if e.cacheN.seen && !e.serverOwn() { // as taskAnswers reads it (answerCached)
		b.summed.cached = min(pricing.MaxTokens, b.summed.cached+max(0, min(e.cacheN.n, e.prompt)))
	}
	b.summed.completion = min(pricing.MaxTokens, b.summed.completion+max(0, e.completion))
}

// ownEnds ends an answer, of an array or the answer itself: its content is text when it is in
// llama.cpp's server's own shape (serverOwn), as the Meter reads it.
func (b *UnrelayedAnswer) ownEnds() {
	if b.element.serverOwn() {
		b.textBytes += b.element.ownText
	}
	b.element.ownText = 0
}

// ownReport is the report of an answer read to its end in llama.cpp's server's own shape
// (Meter.serverAnswer): its tokens_evaluated and tokens_predicted, each when it was a number,
// or ok false when the answer is no such one (an array of them reports as Answers does).
func (b *UnrelayedAnswer) ownReport() (prompt, completion reportedFigure, ok bool) {
	if b == nil || b.answers || b.Open() || !b.done || !b.element.serverOwn() {
		return reportedFigure{}, reportedFigure{}, false
	}
	return b.element.own[0], b.element.own[1], true
}
