package metering

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// The OpenAI-shaped answers and chunks (chat, completions, embeddings): their choices' text
// and their usage reports, read in one pass over the top-level keys.

// openAIObject reads a chat, completions or embeddings chunk or body in one pass over its
// top-level keys: separate lookups for choices, usage, x_groq and error would each rescan
// the chunk, and this runs on every chunk of a stream.
func (m *Meter) openAIObject(s, choiceKey string) {
	var usage, groq, choices, timings gjson.Result
	var server serverFields
	before, sole, objects := m.res.OutputChars, int64(-1), choiceObjects{secondAt: -1}
	gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content", "stop", "tokens_predicted", "tokens_evaluated", "index":
			server.set(k.Str, v) // llama.cpp's server's own shape (serverAnswer)
		case "choices":
			choices = v
			sole = m.openAIChoices(v, choiceKey, &objects)
		case "usage":
			usage = v
		case "model":
			keepName(&m.res.Model, v, false)
		case "x_groq": // Groq reports usage here even when include_usage was not asked for
			groq = v
		case "timings": // llama.cpp's server: its task's own (taskReport), its cached prompt (taskUsage)
			timings = v
		case "error":
			if isError(v) {
				m.res.UpstreamError = true
			}
		}
		return true
	})
	if m.format == FormatCompletions && !choices.Exists() && !usage.Exists() && server.own() {
		m.serverAnswer(server, choiceKey == "message")
		return
	}
	if sole >= 0 && sole < maxLedgerChoices {
		if sole >= int64(len(m.choices)) {
			m.choices = append(m.choices, make([]choiceLedger, sole+1-int64(len(m.choices)))...)
		}
		m.choices[sole].chars += m.res.OutputChars - before
	} else {
		sole = -1
	}
	finished := m.finishing
	m.finishing = -1
	if sole >= 0 && choices.Get("0.finish_reason").String() != "" {
		m.finishing = sole
	}
	if m.taskUsage(usage, timings) || m.openAIUsage(groq.Get("usage")) {
		m.lastTaskPrompt = -1 // unless it is a task's own (batchTaskReport)
		if choiceKey == "message" {
			m.bodyTask = usage.IsObject() && m.taskReport(timings)
		}
		switch {
		case finished >= 0 && sole < 0 && choices.IsArray() && choices.Get("#").Int() == 0:
			m.finalReport(finished)
			m.taskFinals = m.taskFinals || usage.IsObject() && m.taskReport(timings)
		case choiceKey == "message" && m.wholeTasks(objects.n, m.res.OutputChars-objects.secondAt):
		case m.finishing >= 0 && usage.IsObject() && m.taskReport(timings):
			// llama.cpp's /v1/completions stream ends each task on one chunk: its choice's
			// finishing chunk carries that answer's usage (server_task_result_cmpl_final::
			// to_json_oaicompat), which is the answer's final report, as the usage chunk after
			// a chat task's finishing chunk is.
			m.finalReport(m.finishing)
			m.taskFinals = true
			m.batchTaskReport(m.finishing)
			m.choiceReport(-1)
			return
		}
		m.choiceReport(sole)
		return
	}
	if !usage.Exists() && strings.Contains(s, `"usage"`) {
		// Moonshot (Kimi) reports a stream's usage in its finishing choice, and there alone
		// unless include_usage is honoured (then a top-level report follows it, and replaces
		// it). Looked for only in a chunk without a top-level usage key that names one: an
		// include_usage stream's every chunk has "usage":null, and this runs on each.
		choices.ForEach(func(_, c gjson.Result) bool {
			if m.openAIUsage(c.Get("usage")) {
				m.choiceReport(-1)
				return false
			}
			return true
		})
	}
}

// choiceObjects counts the choice objects of an answer read so far (of all its "choices", as
// an UnrelayedAnswer counts them), and secondAt is OutputChars when the second began, -1
// before it did: where the first choice's text ends (wholeTasks).
type choiceObjects struct{ n, secondAt int64 }

// openAIChoices counts generated text in choices[].<key> (delta for chunks, message for
// bodies), or choices[].text for legacy completions, and the choice objects in objects. It
// returns the index of the choice when there is one alone that names its index, -1 otherwise.
func (m *Meter) openAIChoices(choices gjson.Result, key string, objects *choiceObjects) (sole int64) {
	sole, count := -1, 0
	choices.ForEach(func(k, c gjson.Result) bool {
		if count++; count == 1 {
			if idx := c.Get("index"); idx.Type == gjson.Number && idx.Num >= 0 {
				sole = idx.Int()
			}
		} else {
			sole = -1
		}
		if c.IsObject() {
			if objects.n++; objects.n == 2 {
				objects.secondAt = m.res.OutputChars
			}
		}
		if m.format == FormatCompletions {
			m.res.OutputChars += m.completionText(k.Int(), c)
			return true
		}
		// A message (delta) that gives its reasoning under both names (vLLM copies reasoning
		// into reasoning_content, a router may pass both on) carries one text, which the model
		// wrote once: the larger is counted, as a prompt's estimate counts one sent back.
		var reasoningContent, reasoning int64
		c.Get(key).ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "content":
				m.res.OutputChars += strLen(v) + chunksLen(v)
			case "refusal":
				m.res.OutputChars += strLen(v)
			case "reasoning_content":
				reasoningContent += strLen(v)
			case "reasoning":
				reasoning += strLen(v)
			case "tool_calls":
				v.ForEach(func(_, tc gjson.Result) bool {
					// A function's arguments, or what the model wrote for a custom tool.
					m.res.OutputChars += strLen(tc.Get("function.arguments")) + strLen(tc.Get("custom").Get("input"))
					return true
				})
			case "function_call":
				m.res.OutputChars += strLen(v.Get("arguments"))
			case "audio":
				m.spokenAnswer(v, key == "delta")
			}
			return true
		})
		m.res.OutputChars += max(reasoningContent, reasoning)
		return true
	})
	return sole
}

// The figures of an OpenAI-style usage report.
const (
	figPrompt = iota
	figCompletion
	figTotal
	figCached
	figWritten
	figAudio
	figAudioOut
	figWritten1h
	figureCount
)

// reportedFigure is one figure of a usage report: its value, and whether a report carried it.
type reportedFigure struct {
	n    int64
	seen bool
}

// openAIUsage replaces the usage with the one in u, if u is a usage object. Replacing, never
// adding: some providers (xAI) repeat a cumulative total on every chunk. The Responses API
// names the same counts input_tokens/output_tokens.
func (m *Meter) openAIUsage(u gjson.Result) bool {
	return m.taskUsage(u, gjson.Result{})
}

// usageFigures reads the figures of u, a usage report, and whether it is one (an empty object
// is none).
func usageFigures(u gjson.Result) (fresh [figureCount]reportedFigure, ok bool) {
	if !u.IsObject() {
		return fresh, false
	}
	set := func(fig int, paths ...string) {
		fresh[fig].n, fresh[fig].seen = first(u, paths...)
	}
	set(figPrompt, "prompt_tokens", "input_tokens")
	set(figCompletion, "completion_tokens", "output_tokens")
	set(figTotal, "total_tokens")
	if !fresh[figPrompt].seen && !fresh[figCompletion].seen && !fresh[figTotal].seen {
		return fresh, false // not a usage report (e.g. an empty object), keep the last real one
	}
	set(figCached, "prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens",
		"prompt_cache_hit_tokens", "cached_tokens")
	// Cache writes: OpenAI's and OpenRouter's cache_write_tokens, and LiteLLM's names for Claude's
	// (prompt_tokens_details.cache_creation_tokens, and the top-level Anthropic-style
	// cache_creation_input_tokens, the only one its versions of before late 2025 give). LiteLLM
	// gives the one count under several of them: the largest, never their sum.
	fresh[figWritten].n, fresh[figWritten].seen = largest(u, "prompt_tokens_details.cache_write_tokens",
		"input_tokens_details.cache_write_tokens", "prompt_tokens_details.cache_creation_tokens", "cache_creation_input_tokens")
	// A router serving Claude that breaks the writes down by ttl, as Anthropic does (LiteLLM).
	set(figWritten1h, "prompt_tokens_details.cache_creation_token_details.ephemeral_1h_input_tokens",
		"input_tokens_details.cache_creation_token_details.ephemeral_1h_input_tokens")
	set(figAudio, "prompt_tokens_details.audio_tokens", "input_tokens_details.audio_tokens")
	set(figAudioOut, "completion_tokens_details.audio_tokens", "output_tokens_details.audio_tokens")
	return fresh, true
}

// applyUsage replaces the usage with a report whose figures are fresh (openAIUsage), and reports
// whether it was one: a report of zeros alone is none.
func (m *Meter) applyUsage(fresh [figureCount]reportedFigure) bool {
	if countsNothing(fresh) {
		// Every figure 0: no call reads no prompt. A compatible server or relay that puts such
		// a placeholder in each chunk until its real report (usage {0, 0, 0} beside the text)
		// had a stream cut before that report charged nothing at all, prompt and text at 0, and,
		// after an early report of the prompt, hid the text streamed since from its estimate
		// (Result). It is no report, as an empty object is none: the last real one stands.
		return false
	}
	m.lastFigures = fresh
	// The output this report counts by its own figures, for a report of one choice alone
	// (choiceReport).
	m.reportOutput = fresh[figCompletion].n
	if fresh[figTotal].seen && fresh[figPrompt].seen {
		m.reportOutput = max(m.reportOutput, fresh[figTotal].n-fresh[figPrompt].n)
	}
	// A cumulative count cannot fall to nothing: a 0 where an earlier report gave a count is
	// no count (a proxy that appends an empty usage chunk after the provider's real one, a
	// router whose last chunk counts the output alone with prompt_tokens 0), as a top-level 0
	// of Anthropic's prompt side is (anthropicUsage). Taken, it billed the call at nothing, or
	// its prompt at nothing. A prompt of 0 says nothing of its parts either: its cached_tokens
	// 0 billed a cached prompt at the full price.
	if zeroAfterCount(fresh[figPrompt], m.reported[figPrompt]) {
		for _, fig := range [...]int{figPrompt, figCached, figWritten, figWritten1h, figAudio} {
			fresh[fig].seen = false
		}
	}
	if zeroAfterCount(fresh[figCompletion], m.reported[figCompletion]) {
		fresh[figCompletion].seen, fresh[figAudioOut].seen = false, false
	}
	if zeroAfterCount(fresh[figTotal], m.reported[figTotal]) {
		fresh[figTotal].seen = false
	}
	// Reports are cumulative and the last is final, but a later one may leave figures out (a
	// chunk with the output count alone, one without the details): a figure it does not
	// carry keeps its earlier value, as Anthropic's message_delta fields do. Replaced
	// whole, such a report billed the prompt at 0, or the cached prompt at the full price.
	for i, f := range fresh {
		if f.seen {
			m.reported[i] = f
		}
	}
	m.setUsage()
	m.charsAtReport, m.pcmAtReport, m.clipAtReport = m.res.OutputChars, m.pcmBytes, m.clipMicros
	return true
}

// setUsage makes the usage the one the figures reported say.
func (m *Meter) setUsage() {
	prompt, completion := m.reported[figPrompt].n, m.reported[figCompletion].n
	promptSeen, totalSeen := m.reported[figPrompt].seen, m.reported[figTotal].seen
	switch {
	case promptSeen:
	case m.format == FormatEmbeddings:
		// An embedding has no output: a total alone (Voyage AI's whole report) is its
		// input. Read as output, it was billed at an embedding model's output price, 0.
		prompt = m.reported[figTotal].n
	case totalSeen && m.reported[figCompletion].seen:
		// A report of the completion and the total alone (some compatible servers'): the
		// prompt is their difference. Read as 0, the prompt went unbilled and the whole
		// total was billed as output, at the output price.
		prompt = max(0, m.reported[figTotal].n-completion)
	}
	// With neither a prompt nor a total, the report says nothing of the prompt: the
	// settlement bills its estimate, as for a call without a report.
	m.res.PromptMissing = !promptSeen && !totalSeen
	cached, written := m.reported[figCached].n, m.reported[figWritten].n
	output := completion
	// xAI and Gemini leave reasoning out of completion_tokens.
	if total := m.reported[figTotal]; total.seen && total.n-prompt > output {
		output = total.n - prompt
	}
	input := max(0, prompt-cached-written)
	m.res.Usage = pricing.Usage{
		Input:      input,
		CacheRead:  cached,
		CacheWrite: written,
		// The one-hour part of the writes, when the report gives it: never more than them.
		CacheWrite1h: min(m.reported[figWritten1h].n, written),
		Output:       output,
		// audio_tokens counts the prompt's audio, cached or not; which cached tokens were audio
		// is not said. All of it up to the uncached input is billed at the audio price: never
		// less than the provider charged.
		AudioInput: min(max(0, m.reported[figAudio].n), input),
		// The answer's audio, part of completion_tokens (its transcript is the text part).
		AudioOutput: min(max(0, m.reported[figAudioOut].n), output),
	}
	m.res.CacheWriteSplit = m.reported[figWritten1h].seen
	m.res.Reported = true
}

// countsNothing reports whether a report's figures, fresh, are all 0 where it gives them.
func countsNothing(fresh [figureCount]reportedFigure) bool {
	for _, f := range fresh {
		if f.seen && f.n > 0 {
			return false
		}
	}
	return true
}

// zeroAfterCount reports whether fresh, a figure of a later report, is a 0 where an earlier
// report's figure, before, was a count above 0.
func zeroAfterCount(fresh, before reportedFigure) bool {
	return fresh.seen && fresh.n == 0 && before.seen && before.n > 0
}
