package metering

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// llama.cpp's server's shapes that are not OpenAI's: its own answer shape, a whole answer given as
// an array of its tasks' answers, and the cache count in its timings.

// serverFields are the keys of an answer or event in llama.cpp's server's own shape, which
// its builds before it made /v1/completions OpenAI-compatible (ggml-org/llama.cpp PR 10974,
// December 2024) answered that route with: no choices and no usage, but the task's text
// (content), whether it ended (stop), and on its last event, or its whole answer, the tokens
// it decoded (tokens_predicted) and its prompt's (tokens_evaluated); index, the task's place
// in a batch of prompts (its builds of late 2024).
type serverFields struct{ content, stop, predicted, evaluated, index gjson.Result }

// set keeps v as the field named key, the first such key's (as gjson's Get reads an answer
// of an array, taskAnswers, and an UnrelayedAnswer reads one).
func (f *serverFields) set(key string, v gjson.Result) {
	var dst *gjson.Result
	switch key {
	case "content":
		dst = &f.content
	case "stop":
		dst = &f.stop
	case "tokens_predicted":
		dst = &f.predicted
	case "tokens_evaluated":
		dst = &f.evaluated
	default:
		dst = &f.index
	}
	if !dst.Exists() {
		*dst = v
	}
}

// own reports whether the fields are such an answer's: stop is a boolean in every one of its
// answers and events.
func (f serverFields) own() bool { return f.stop.Type == gjson.True || f.stop.Type == gjson.False }

// serverAnswer reads an answer or event in llama.cpp's server's own shape (serverFields). Read
// as an OpenAI-shaped one, it was no answer: its call was charged the prompt's estimate and
// none of its output. Its content is the text of its task's choice (its index; 0 without one),
// and its counts are that task's report: tokens_evaluated the prompt, tokens_predicted the
// output. A whole answer is one task's (a batch's are an array of them, taskAnswers). Each
// task ends with such a report of its own, as a task's usage chunk does in the
// server's later OpenAI-shaped streams (finalReport, batchTaskReport): the reports of several
// tasks are summed, and a batch's prompts without one are charged their estimate (Result).
// Without counts (a stream cut before its last event), the text is there for the estimate.
func (m *Meter) serverAnswer(f serverFields, whole bool) {
	i := int64(0)
	if f.index.Type == gjson.Number && f.index.Num >= 0 && !whole { // a whole answer is one task's
		i = f.index.Int()
	}
	n := strLen(f.content)
	m.res.OutputChars += n
	var fresh [figureCount]reportedFigure
	fresh[figPrompt].n, fresh[figPrompt].seen = tokenCount(f.evaluated)
	fresh[figCompletion].n, fresh[figCompletion].seen = tokenCount(f.predicted)
	m.serverReport(i, n, fresh)
}

// serverReport records that choice i (a task of llama.cpp's server, in its own shape) streamed
// chars bytes of text more, and applies fresh, its task's report if it carries one.
func (m *Meter) serverReport(i, chars int64, fresh [figureCount]reportedFigure) {
	if i < maxLedgerChoices {
		if i >= int64(len(m.choices)) {
			m.choices = append(m.choices, make([]choiceLedger, i+1-int64(len(m.choices)))...)
		}
		m.choices[i].chars += chars
	} else {
		i = -1
	}
	if !m.applyUsage(fresh) {
		return
	}
	m.lastTaskPrompt = -1
	if i >= 0 {
		m.finalReport(i)
		m.taskFinals = true
		m.batchTaskReport(i)
	}
	m.choiceReport(-1)
}

// taskAnswers reads a completions answer that is a JSON array of whole answers: llama.cpp's
// server, in its builds before it merged them into one (those of 2025 up to its n_cmpl
// support), answered a batch of several prompts, not streamed, so — each element one prompt's
// task, with its choice and a usage of that task alone (handle_completions_impl, "multiple
// results (multitask)"). Read as no answer, the call was charged its prompts' estimate and
// none of its output. Every element's choices count, as one answer's, and their usages are
// summed into the report, when each carries one; the sum is the gateway's reading, and the
// row says so (summedAnswers). Without a report from each, the text is estimated. Of each
// element's prompt, the part its timings.cache_n counts (answerCached) is read from the cache,
// as a single answer's is (taskUsage).
func (m *Meter) taskAnswers(s string) {
	var prompt, cached, completion int64
	answers, reported, objects := 0, true, choiceObjects{secondAt: -1}
	gjson.Parse(s).ForEach(func(_, a gjson.Result) bool {
		if !a.IsObject() {
			return true
		}
		answers++
		keepName(&m.res.Model, a.Get("model"), false)
		m.openAIChoices(a.Get("choices"), "message", &objects)
		u := a.Get("usage")
		p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
		cacheN := a.Get("timings").Get("cache_n") // the first timings, as an UnrelayedAnswer reads it
		if f := (serverFields{stop: a.Get("stop")}); !a.Get("choices").Exists() && !u.Exists() && f.own() {
			// An answer in the server's own shape, its builds' before PR 10974 (serverAnswer):
			// its text is its content, its report its tokens_evaluated and tokens_predicted.
			// Those builds' timings had no cache_n (and its tokens_cached is no cache read).
			m.res.OutputChars += strLen(a.Get("content"))
			p, c, cacheN = a.Get("tokens_evaluated"), a.Get("tokens_predicted"), gjson.Result{}
		}
		if p.Type != gjson.Number || c.Type != gjson.Number {
			reported = false
			return true
		}
		pn := answerFigure(p)
		prompt = min(pricing.MaxTokens, prompt+pn)
		cached = min(pricing.MaxTokens, cached+answerCached(cacheN, pn))
		completion = min(pricing.MaxTokens, completion+answerFigure(c))
		return true
	})
	if answers == 0 || !reported {
		return
	}
	m.summedReport(prompt, cached, completion)
}

// answerFigure is a figure of an answer of an array (taskAnswers), a number: its Int, within
// [0, pricing.MaxTokens] before it is added to the others', as tokenCount bounds every other
// report's figure. Added raw, a figure past int64 (1e300, 2^63-1: gjson reads both as
// math.MaxInt64) overflowed the sum, which wrapped negative: the batch's report was read as
// none and charged its estimate, where the same figure in one answer is pricing.MaxTokens.
func answerFigure(v gjson.Result) int64 {
	return max(0, min(v.Int(), pricing.MaxTokens))
}

// answerCached is the part of the prompt of an answer of an array (taskAnswers), prompt its
// prompt_tokens, that its timings.cache_n, cacheN, counts read from llama.cpp's server's KV
// cache: the builds that answered a batch so (PR 15827 of September 2025 up to PR 17775 of
// December 2025) report it there alone, as their single answers do (taskUsage). A number
// alone counts, in [0, prompt], as the array's other figures are read.
func answerCached(cacheN gjson.Result, prompt int64) int64 {
	if cacheN.Type != gjson.Number {
		return 0
	}
	return max(0, min(cacheN.Int(), prompt))
}

// summedReport takes the sum of the reports of the whole answers of a completions answer given
// as a JSON array of them (taskAnswers), their prompt_tokens, the cached part of those
// (answerCached) and completion_tokens each in [0, pricing.MaxTokens], as its report: a usage
// of those figures alone, applied as openAIUsage applies one read (a sum of zeros is no report).
func (m *Meter) summedReport(prompt, cached, completion int64) {
	var fresh [figureCount]reportedFigure
	fresh[figPrompt] = reportedFigure{n: prompt, seen: true}
	fresh[figCompletion] = reportedFigure{n: completion, seen: true}
	if cached > 0 {
		fresh[figCached] = reportedFigure{n: min(cached, prompt), seen: true}
	}
	m.summedAnswers = m.applyUsage(fresh)
}

// taskUsage is openAIUsage of a usage u beside timings, llama.cpp's server's figures of the
// task the usage counts (an answer's or a chunk's "timings"; none when not an object): its
// builds from PR 15827 (September 2025) to PR 19361 (February 2026) report the prompt tokens
// they reused from their KV cache there alone, as timings.cache_n, and their usage has no
// cached_tokens. cache_n is then the cached part of the report's prompt_tokens, which counts
// the whole prompt (slot.n_prompt_tokens_cache, the prompt's prefix the cache held, one token
// short of it at most); read as none, those tokens were billed at the full input price where
// the model has a cache-read price. The later builds give the same count as
// prompt_tokens_details.cached_tokens too: a cached figure in the usage wins. cache_n is read
// only beside a prompt_tokens, and never above it.
func (m *Meter) taskUsage(u, timings gjson.Result) bool {
	fresh, ok := usageFigures(u)
	if !ok {
		return false
	}
	if n, ok := serverCached(timings, fresh); ok {
		fresh[figCached] = reportedFigure{n: n, seen: true}
	}
	return m.applyUsage(fresh)
}

// serverCached is the cached part of a report's prompt, fresh, that llama.cpp's timings beside
// it give (taskUsage): its cache_n, at most the prompt, when the report gives a prompt and no
// cached figure of its own.
func serverCached(timings gjson.Result, fresh [figureCount]reportedFigure) (int64, bool) {
	if !timings.IsObject() || fresh[figCached].seen || !fresh[figPrompt].seen {
		return 0, false
	}
	n, ok := tokenCount(timings.Get("cache_n"))
	return min(n, fresh[figPrompt].n), ok
}
