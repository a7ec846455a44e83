package metering

import (
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// A call of several answers: the choices of n counted apart, the prompts of a completions batch
// (each a llama.cpp server task with a report of its own), and the prompts a call's echo repeats.

// BatchPrompts tells a completions Meter that the call's prompt is a batch of several:
// estimates is the estimate of each (PromptEstimates), perPrompt the choices each is answered
// with (n), choice i answering prompt i/perPrompt. llama.cpp's server runs each prompt as a
// task of its own (each of its n answers too), and each task's report counts its own prompt
// alone: the batch's other prompts are charged by their tasks' reports, or at their estimate
// where none came (otherPrompts).
func (m *Meter) BatchPrompts(estimates []int64, perPrompt int64) {
	if m.format != FormatCompletions || perPrompt < 1 || len(estimates) < 2 {
		return
	}
	m.batchPrompts, m.batchPer = estimates, perPrompt
	m.taskPrompts = make([]taskPrompt, len(estimates))
}

// EchoPrompts tells a completions Meter that the call asked for its prompts echoed (echo):
// prompts are its prompts, perPrompt the choices each is answered with (n). The echo at the
// start of each choice's text is no output of the model, and its estimate leaves it out:
// only as far as the text is the prompt, byte for byte.
func (m *Meter) EchoPrompts(prompts []string, perPrompt int64) {
	if m.format != FormatCompletions || perPrompt < 1 || len(prompts) == 0 {
		return
	}
	m.echoPrompts, m.echoPer = prompts, perPrompt
}

// completionText is the generated text of a completions choice at position pos of its
// chunk or body: its text's length, less what of it is the echoed prompt.
func (m *Meter) completionText(pos int64, c gjson.Result) int64 {
	t := c.Get("text")
	if t.Type != gjson.String {
		return 0
	}
	text := t.Str
	if m.echoPrompts == nil || text == "" {
		return int64(len(text))
	}
	i := pos
	if idx := c.Get("index"); idx.Type == gjson.Number {
		i = idx.Int()
	}
	if i < 0 || i/m.echoPer >= int64(len(m.echoPrompts)) {
		return int64(len(text))
	}
	prompt := m.echoPrompts[i/m.echoPer]
	if m.echoSeen == nil {
		m.echoSeen = make(map[int64]int)
	}
	seen := m.echoSeen[i]
	if seen < 0 || seen >= len(prompt) {
		return int64(len(text))
	}
	n := min(len(text), len(prompt)-seen)
	if text[:n] != prompt[seen:seen+n] {
		m.echoSeen[i] = -1 // no echo: all of it is the model's
		return int64(len(text))
	}
	m.echoSeen[i] = seen + n
	return int64(len(text) - n)
}

// choicesCountedApart reports whether the stream's reports counted its choices apart, each
// to be charged its own count (sum), and whether those counts are the reports that came right
// after each choice's finishing chunk (finals):
//   - vLLM's, SGLang's and TensorRT-LLM's continuous_usage_stats: each chunk carries one
//     choice and a usage of that choice's tokens alone, and only the final report, choices
//     empty, sums them. A stream cut before it ends on one choice's report (lastChoice), such
//     reports having come for several choices, one of them more than once (a server that
//     reports the whole once, on each choice's finishing chunk, is not summed).
//   - llama.cpp's server runs each of the n answers as a task, and ends every task with its
//     finishing chunk and a usage chunk (choices empty) of that answer's tokens alone (on
//     /v1/completions, that usage on the finishing chunk itself, beside the task's timings):
//     such reports came for several choices (finalReport), where OpenAI's and vLLM's one whole
//     report comes once, after the last choice finished; or one came, a task's own (taskFinals),
//     of a stream of several choices cut before the other tasks ended.
func (m *Meter) choicesCountedApart() (sum, finals bool) {
	switch {
	case m.lastChoice >= 0 && m.choicesReported > 1 && m.choiceReportedAgain:
		return true, false
	case m.lastChoice < 0 && (m.finalsReported > 1 || m.taskFinals && len(m.choices) > 1):
		// One task's report alone, of several choices: a llama.cpp stream cut before the other
		// tasks ended, whose text so far is no part of it.
		return true, true
	}
	return false, false
}

// choiceReport records that the report just read rode on a chunk of choice i alone, or, for
// i < 0, on any other (a final report, choices empty, which counts the whole answer). A
// report on a chunk of one choice may count that choice alone: vLLM's continuous usage does
// with n > 1 (each chunk's completion_tokens is its choice's), as do SGLang's and
// TensorRT-LLM's. Result sums the choices' last reports when such reports came for more than
// one choice, again for one of them (a report on every chunk: a server that reports the whole
// once, on each choice's finishing chunk, is not summed), and no report of the whole came
// after them.
func (m *Meter) choiceReport(i int64) {
	m.lastChoice = i
	if i < 0 {
		return
	}
	c := &m.choices[i]
	if c.reported {
		m.choiceReportedAgain = true
	} else {
		c.reported = true
		m.choicesReported++
	}
	// A choice's count is cumulative, and cannot fall (see openAIUsage).
	c.output, c.charsAt = max(c.output, m.reportOutput), c.chars
}

// finalReport records that the report just read, choices empty, came right after choice i's
// finishing chunk. Such a report is the whole answer's when it comes once, after the last
// choice finished (OpenAI's, vLLM's). llama.cpp's server runs each of n answers as a task of
// its own and ends every task so: its finishing chunk, then a usage of that answer alone
// (server_task_result_cmpl_final::to_json_oaicompat_chat_stream). Result sums such reports
// when they came for more than one choice and no report came after them on a chunk of one.
func (m *Meter) finalReport(i int64) {
	c := &m.choices[i]
	if !c.finaled {
		c.finaled = true
		m.finalsReported++
	}
	c.final, c.finalAt = max(c.final, m.reportOutput), c.chars
}

// batchTaskReport records that the report just read is a llama.cpp server task's own, of choice
// i of a batch (BatchPrompts): its prompt is the prompt of i's, and that prompt alone.
func (m *Meter) batchTaskReport(i int64) {
	if m.batchPer < 1 || i < 0 || i/m.batchPer >= int64(len(m.batchPrompts)) {
		return
	}
	p := i / m.batchPer
	// A task's report counts its task alone, so no earlier report's figure stands for one it
	// does not give: another task's cached tokens or total say nothing of this one. Kept (a
	// report in the server's own shape gives no cache figure), they read this task's prompt
	// from the cache by another task's count, and charged another's total as its output.
	m.reported = m.lastFigures
	m.setUsage()
	m.taskPrompts[p] = taskPrompt{tokens: m.reported[figPrompt].n, cached: m.reported[figCached].n, reported: true}
	m.lastTaskPrompt = p
}

// otherPrompts is the prompt of a batch that the last report, a llama.cpp server task's own,
// does not count: every other prompt of the batch, each its own task's report where one came
// (a stream's task that ended), else its estimate (a whole answer, which reports its first
// task alone; a stream cut before the prompt's tasks ended). A prompt answered n times counts
// once, as OpenAI bills it. It is given as uncached input and cache reads, the part of a
// report its prompt cache held read from the cache as the report's own is. Nothing when the
// last report was no task's own: a report of the whole batch (OpenAI's, vLLM's) counts every
// prompt already.
func (m *Meter) otherPrompts() (input, cached int64) {
	if m.lastTaskPrompt < 0 {
		return 0, 0
	}
	for p, est := range m.batchPrompts {
		t := m.taskPrompts[p]
		switch {
		case int64(p) == m.lastTaskPrompt:
		case t.reported:
			c := min(max(0, t.cached), max(0, t.tokens))
			input, cached = input+max(0, t.tokens)-c, cached+c
		default:
			input += est
		}
		input, cached = min(input, pricing.MaxTokens), min(cached, pricing.MaxTokens)
	}
	return input, cached
}

// wholeTasks reports whether a whole answer of choices choice objects, the text of all but the
// first of them others bytes, is llama.cpp's server's answer of several tasks: it runs
// each of n answers (and each prompt of a completions batch) as a task, and answers whole
// with every task's choice in the first task's body, beside that first task's usage and
// timings alone (handle_completions_impl; bodyTask). Read as the whole, the other choices'
// tokens went unbilled: their text is charged at its estimate on top of the report, and so
// are the prompts of a batch but the first (Result).
// Meter.Body reads it so, and so does an answer too large to relay, read past (AddUnreported).
func (m *Meter) wholeTasks(choices, others int64) bool {
	if !m.bodyTask || choices < 2 {
		return false
	}
	m.unreportedChoices = others
	m.batchTaskReport(0) // and the prompts of a batch but the first at their estimate
	return true
}

// taskReport reports whether the report just read is one llama.cpp server task's own: its
// timings (predicted_n, the tokens that task decoded) count the output the report counts. A
// server that reports the whole answer on each choice's finishing chunk sends no such figure,
// and its last report stays the whole.
func (m *Meter) taskReport(timings gjson.Result) bool {
	n := timings.Get("predicted_n")
	return n.Type == gjson.Number && n.Int() == m.reportOutput
}
