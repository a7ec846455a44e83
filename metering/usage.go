package metering

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// Format is the wire format of a response, which decides where its usage report lives.
type Format int

const (
	FormatChat Format = iota
	FormatCompletions
	FormatResponses
	FormatEmbeddings
	FormatAnthropic
)

// Result is what a response said about its cost.
type Result struct {
	Usage pricing.Usage
	// Reported is false when nothing in the response said what it cost: settlement must
	// then fall back to an estimate and mark the charge as estimated.
	Reported bool
	// PromptMissing is set when a usage was reported but said nothing of the prompt (an
	// OpenAI-style report with neither prompt_tokens nor total_tokens, an Anthropic-shaped one
	// that never gave input_tokens): Usage's uncached input is then 0, and settlement bills the
	// prompt's estimate instead, marked estimated.
	PromptMissing bool
	// Estimated is set when a usage was reported but its output count is not final (an
	// Anthropic stream cut before message_delta: message_start's output_tokens is a
	// placeholder), so Output is at least the estimate of the text streamed.
	Estimated bool
	// StartOnly is set when the only usage seen is an Anthropic stream's message_start: the
	// prompt's count and a placeholder output, said before the model did anything. Anthropic
	// does not bill a request that then fails (an error event, such as overloaded_error, before
	// any content), so it is no report of work done then.
	StartOnly bool
	// UpstreamError is set when a 200 stream or body carried an error event or object.
	UpstreamError bool
	// OutputChars counts the bytes of generated text seen, the base of the output estimate
	// when no usage came (a client that cancels mid-stream, a provider that reports none).
	OutputChars int64
	// AudioOutput estimates the tokens of the spoken answer seen (a chat answer's audio.data),
	// from how long it plays: the audio part of the output estimate when no usage came.
	AudioOutput int64
	// ResponseID is the id a Responses answer gives itself (response.id), "" when none: what a
	// later request names as its previous_response_id, whose context it then carries.
	ResponseID string
	// ItemIDs are the ids of a Responses answer's output items (output[].id; a stream's
	// response.output_item.added), which a later request may name instead of sending the item
	// (an item_reference, or the item with its id): the provider fetches it from its store.
	ItemIDs []string
	// SpokenIDs are the ids of the spoken answers a chat answer gave (audio.id, one a choice),
	// which a later request sends back for the model to hear again: the gateway records their
	// audio tokens under them (see SpokenAnswersSentBack).
	SpokenIDs []string
	// CacheWriteSplit is set when an OpenAI-shaped usage said which of its cache writes were
	// one-hour ones (LiteLLM's prompt_tokens_details.cache_creation_token_details): Usage's
	// CacheWrite1h is then that figure. Otherwise such a usage reports the writes' total only,
	// whatever the ttl the request asked for (see proxy's settlementAs).
	CacheWriteSplit bool
	// CacheWrite5m is the part of an Anthropic usage's cache writes it says were five-minute
	// ones (cache_creation.ephemeral_5m_input_tokens). message_delta may give a larger count of
	// writes than message_start's without breaking it down (a server tool's later turns): the
	// writes no report says were five-minute ones may be one-hour ones (see proxy's
	// settlementAs).
	CacheWrite5m int64
	// Model is the model the response says answered (its first "model"), "" when none did:
	// a provider may answer an alias with a dated snapshot, or route to another model.
	Model string
}

// Produced reports whether the response carried any output the model generated: text or audio.
func (r Result) Produced() bool { return r.OutputChars > 0 || r.AudioOutput > 0 }

// EstimatedOutput is the output the response carried as far as it was seen, for a settlement
// without a usage report: its text's tokens and its audio's, the audio part priced apart.
func (r Result) EstimatedOutput() (output, audio int64) {
	return min(maxEstimatedTokens, EstimateOutputTokens(r.OutputChars)+r.AudioOutput), r.AudioOutput
}

// maxModelName bounds the model name a Meter keeps: longer is no name a price could match.
const maxModelName = 256

// Meter accumulates the usage of one response. It keeps nothing of the events it is shown,
// so the scanner may reuse their memory.
type Meter struct {
	format Format
	res    Result
	// outputFinal: an Anthropic usage whose output_tokens is the final count was seen
	// (message_delta or a whole body), not only message_start's placeholder.
	outputFinal bool
	// reported holds the latest value of each OpenAI-style usage figure, for the ones a
	// report has carried so far (see openAIUsage); lastFigures those the last report carried
	// itself, none kept from before (see batchTaskReport).
	reported, lastFigures [figureCount]reportedFigure
	// pcmBytes counts the raw audio of a streamed spoken answer (16-bit 24 kHz mono PCM, the
	// only format OpenAI streams), clipMicros how long the clips of whole answers play.
	pcmBytes, clipMicros int64
	// patchDeltas: a Responses stream sent a patch's diff in deltas, already counted, so the
	// diff its finished item repeats is not counted again.
	patchDeltas bool
	// anthropicInput: an Anthropic usage gave input_tokens (at the top or in an iteration).
	// Without it the usage says nothing of the uncached prompt (an Anthropic-compatible server
	// whose message_start carries no usage and whose message_delta counts the output alone):
	// read as 0, the prompt went unbilled.
	anthropicInput bool
	// anthropicOutputMissing: a whole Anthropic answer's usage gave no output_tokens (absent,
	// null or no number). Read as 0, the answer's text went unbilled.
	anthropicOutputMissing bool
	// echoPrompts: a completions call asked for echo, so each choice's text begins with its
	// prompt, which the provider bills as input, not output. Choice i answers prompt
	// i/echoPer ("" for a token array, whose text is not known: counted as output, never
	// under the provider's charge). echoSeen holds, by choice, how much of its echo was seen
	// so far, -1 once its text parted from the prompt (a server that does not echo).
	echoPrompts []string
	echoPer     int64
	echoSeen    map[int64]int
	// charsAtReport is OutputChars when the last OpenAI-style usage report came: a report
	// counts the output up to the chunk it rides on, not the text streamed after it.
	// pcmAtReport and clipAtReport are pcmBytes and clipMicros then: nor the audio.
	charsAtReport, pcmAtReport, clipAtReport int64
	// choices holds, by index, what each choice of a chat or completions answer streamed in
	// chunks of its own and what the last report riding on such a chunk counted (see
	// choiceReport). choicesReported counts the choices such a report counted, choiceReportedAgain
	// is set once one choice carried a second, and lastChoice is the choice the last report rode
	// on, -1 when it rode on no chunk of one choice alone.
	choices             []choiceLedger
	choicesReported     int
	choiceReportedAgain bool
	lastChoice          int64
	// finishing is the choice whose finishing chunk (one choice, a finish_reason) was the chunk
	// read last, -1 when it was none; finalsReported counts the choices a report with choices
	// empty came right after (see finalReport).
	finishing      int64
	finalsReported int
	// taskFinals: a final report was a llama.cpp server task's own (taskReport), so it counts
	// its choice alone even when it is the only one that came (a stream cut before the other
	// tasks ended).
	taskFinals bool
	// unreportedChoices is the text of a whole answer's choices that its report does not count:
	// all but the first, in a llama.cpp server's answer of several tasks (taskReport).
	unreportedChoices int64
	// batchPrompts is the estimate of each prompt of a completions batch of several, each
	// answered by batchPer choices (BatchPrompts). taskPrompts holds, by prompt, what a
	// llama.cpp server task's own report counted of it (none while no report did), and
	// lastTaskPrompt is the prompt the last report was such a report of, -1 when the last
	// report was none.
	batchPrompts   []int64
	batchPer       int64
	taskPrompts    []taskPrompt
	lastTaskPrompt int64
	// bodyTask: a whole answer's report is one llama.cpp server task's own (taskReport), the
	// first task's in an answer of several (wholeTasks).
	bodyTask bool
	// summedAnswers: the report is the sum of the reports of a completions answer given as a
	// JSON array of whole answers (taskAnswers).
	summedAnswers bool
	// reportOutput is the output the last report counted by its own figures (its
	// completion_tokens, or its total less its prompt when larger), none kept from before.
	reportOutput int64
}

// taskPrompt is what a llama.cpp server task's report counted of its prompt: its tokens, and
// of them those its prompt cache held (prompt_tokens_details.cached_tokens, or its timings'
// cache_n: taskUsage).
type taskPrompt struct {
	tokens, cached int64
	reported       bool
}

// choiceLedger is one choice's part of a stream whose reports count the choices apart.
type choiceLedger struct {
	chars, charsAt, output int64
	reported               bool
	// final is the report with choices empty that came right after this choice's finishing
	// chunk, and finalAt the choice's text then (see finalReport).
	final, finalAt int64
	finaled        bool
}

// maxLedgerChoices bounds the choice indexes a Meter keeps apart: n is at most 128, times the
// prompts of a completions batch. A chunk of a choice past it counts as one of several.
const maxLedgerChoices = 1024

// NewMeter returns a Meter for responses in format f.
func NewMeter(f Format) *Meter {
	return &Meter{format: f, lastChoice: -1, finishing: -1, lastTaskPrompt: -1}
}

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

// Event observes one streamed event. It must stay cheap: it runs on every chunk.
func (m *Meter) Event(ev Event) {
	if ev.Name == "error" {
		m.res.UpstreamError = true
	}
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 || data[0] != '{' {
		return // comments, keep-alives, [DONE]
	}
	s := unsafeString(data)
	switch m.format {
	case FormatResponses:
		m.responsesEvent(s, eventType(s, ev.Name))
	case FormatAnthropic:
		m.anthropicEvent(s, eventType(s, ev.Name))
	default:
		m.openAIObject(s, "delta")
	}
}

// Body observes a whole non-streamed JSON response body.
func (m *Meter) Body(body []byte) {
	body = TrimBody(body)
	if len(body) > 0 && body[0] == '[' && m.format == FormatCompletions {
		m.taskAnswers(unsafeString(body))
		return
	}
	if len(body) == 0 || body[0] != '{' {
		return
	}
	s := unsafeString(body)
	if isError(gjson.Get(s, "error")) || gjson.Get(s, "type").Str == "error" {
		m.res.UpstreamError = true
	}
	switch m.format {
	case FormatAnthropic:
		keepName(&m.res.Model, gjson.Get(s, "model"), false)
		if u := gjson.Get(s, "usage"); u.IsObject() && !anthropicCountsNothing(u) {
			// A whole answer's usage is its last word, not message_start's placeholder; one
			// that gives no output count (a compatible server's) says nothing of the output,
			// as an OpenAI-shaped one without completion_tokens does (outputUnreported). One
			// of zeros (a shim's that counts nothing) is no report: the answer is estimated.
			m.anthropicOutputMissing = !m.anthropicUsage(u)
			m.outputFinal = true
		}
		gjson.Get(s, "content").ForEach(func(_, c gjson.Result) bool {
			m.res.OutputChars += strLen(c.Get("text")) + strLen(c.Get("thinking"))
			if in := c.Get("input"); in.Exists() {
				m.res.OutputChars += int64(len(in.Raw))
			}
			// A compaction block's summary, the model's words as its compaction_delta is in a
			// stream. A server tool's result block has content too, which is no output.
			if c.Get("type").Str == "compaction" {
				m.res.OutputChars += strLen(c.Get("content"))
			}
			return true
		})
	case FormatResponses:
		keepName(&m.res.Model, gjson.Get(s, "model"), false)
		keepName(&m.res.ResponseID, gjson.Get(s, "id"), false)
		if u := gjson.Get(s, "usage"); u.IsObject() {
			m.openAIUsage(u)
		}
		gjson.Get(s, "output").ForEach(func(_, o gjson.Result) bool {
			m.sawItemID(o.Get("id"))
			// What the stream's deltas carry (responsesEvent): a function's arguments, a custom
			// tool's input, a message's text and refusal, a reasoning item's summary, the code a
			// code interpreter runs, a shell's commands (a local shell's command, which a stream
			// gives whole in its item) and a patch's diff.
			m.res.OutputChars += strLen(o.Get("arguments")) + strLen(o.Get("input")) + strLen(o.Get("code"))
			action := o.Get("action")
			for _, commands := range [...]gjson.Result{action.Get("commands"), action.Get("command")} {
				commands.ForEach(func(_, c gjson.Result) bool {
					m.res.OutputChars += strLen(c)
					return true
				})
			}
			m.res.OutputChars += strLen(o.Get("operation").Get("diff"))
			o.Get("content").ForEach(func(_, c gjson.Result) bool {
				m.res.OutputChars += strLen(c.Get("text")) + strLen(c.Get("refusal"))
				return true
			})
			o.Get("summary").ForEach(func(_, c gjson.Result) bool {
				m.res.OutputChars += strLen(c.Get("text"))
				return true
			})
			return true
		})
	default:
		m.openAIObject(s, "message")
	}
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
		prompt = min(pricing.MaxTokens, prompt+max(0, p.Int()))
		cached = min(pricing.MaxTokens, cached+answerCached(cacheN, p.Int()))
		completion = min(pricing.MaxTokens, completion+max(0, c.Int()))
		return true
	})
	if answers == 0 || !reported {
		return
	}
	m.summedReport(prompt, cached, completion)
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

// Result returns what was seen so far, every token count within [0, pricing.MaxTokens].
func (m *Meter) Result() Result {
	r := m.res
	r.AudioOutput = audioOutputTokens(m.pcmBytes, m.clipMicros)
	if out, _ := r.EstimatedOutput(); out > 0 && m.outputUnreported() {
		// A report that says nothing of the output (completion_tokens absent, null or no
		// number, and no total), as PromptMissing's says nothing of the prompt, for an answer
		// that carried some: the output is the estimate of it, as for an Anthropic stream
		// without its final count. Read as 0, the answer's text went unbilled. The figure is
		// the gateway's, and the row says so.
		r.Usage.Output, r.Estimated = max(r.Usage.Output, out), true
	}
	covered := m.charsAtReport
	if sum, finals := m.choicesCountedApart(); sum {
		// Reports that count each choice apart, in a stream whose last report counted one
		// choice: read as the whole, the other choices' tokens went unbilled. Each choice is
		// its own count, and the text a count covers is its choice's. The sum is the
		// gateway's reading, and the row says so.
		var out int64
		covered = 0
		for _, c := range m.choices {
			n, at := c.output, c.charsAt
			if finals && c.finaled {
				n, at = c.final, c.finalAt
			}
			out, covered = min(out+n, pricing.MaxTokens), covered+at
		}
		r.Usage.Output, r.Estimated = max(r.Usage.Output, out), true
	}
	if m.unreportedChoices > 0 && r.Reported {
		// A whole answer of several llama.cpp tasks, whose report counts the first alone:
		// the others' text at its estimate, and the row says so.
		r.Usage.Output = min(pricing.MaxTokens, r.Usage.Output+EstimateOutputTokens(m.unreportedChoices))
		r.Estimated = true
		covered = r.OutputChars
	}
	if input, cached := m.otherPrompts(); (input > 0 || cached > 0) && r.Reported {
		// A batch's prompts, whose last report, a llama.cpp task's, counts one: the others
		// as their tasks reported them, or at their estimate. The sum is the gateway's
		// reading, and the row says so.
		r.Usage.Input = min(pricing.MaxTokens, r.Usage.Input+input)
		r.Usage.CacheRead = min(pricing.MaxTokens, r.Usage.CacheRead+cached)
		r.Estimated = true
	}
	after := r.OutputChars - covered
	audioAfter := audioOutputTokens(m.pcmBytes-m.pcmAtReport, m.clipMicros-m.clipAtReport)
	if (after > 0 || audioAfter > 0) && r.Reported && !m.outputUnreported() &&
		(m.format == FormatChat || m.format == FormatCompletions) {
		// Text and audio streamed after the last report, which counts the output up to its own
		// chunk: a stream whose provider reported early (a first chunk that counts the prompt
		// and no output yet) and that was cut before its final report. Read as final, the
		// early report charged none of the text the provider made since, nor the audio it
		// spoke. Their estimate is added, the audio's as audio, and the row says so. (A whole
		// stream's final report comes after its text and audio: nothing is.)
		r.Usage.Output = r.Usage.Output + min(maxEstimatedTokens, EstimateOutputTokens(max(0, after))+audioAfter)
		r.Usage.AudioOutput = min(r.Usage.Output, r.Usage.AudioOutput+audioAfter)
		r.Estimated = true
	}
	if m.summedAnswers && r.Reported {
		r.Estimated = true // several answers' reports, summed (taskAnswers)
	}
	if r.Reported && !m.reported[figAudioOut].seen && r.AudioOutput > 0 {
		// A report that does not say how much of the output was audio (a compatible provider
		// without completion_tokens_details), for an answer that spoke: its audio, as long as
		// it played, is billed as audio, up to the output reported. At the text price it was
		// an eighth of what the provider charged.
		// The split is the gateway's estimate, not the provider's word: the row says so.
		r.Usage.AudioOutput = min(r.Usage.Output, r.AudioOutput)
		r.Estimated = true
	}
	if r.Reported && m.format != FormatEmbeddings && m.reported[figTotal].seen &&
		!m.reported[figPrompt].seen && !m.reported[figCompletion].seen {
		// A total alone: which of it was prompt and which output the report does not say. It
		// is billed as output, the dearer, never under the provider's charge; the split is
		// the gateway's, and the row says so.
		r.Estimated = true
	}
	if m.format == FormatAnthropic && r.Reported && !m.anthropicInput {
		r.PromptMissing = true
	}
	if m.format == FormatAnthropic && r.Reported && !m.outputFinal {
		// message_start's output_tokens is a placeholder: the output is the gateway's guess
		// whichever of the two is larger, and the row says so.
		r.Usage.Output, r.Estimated = max(r.Usage.Output, EstimateOutputTokens(r.OutputChars)), true
		r.StartOnly = true
	}
	r.Usage = r.Usage.Clamp()
	return r
}

// outputUnreported reports whether a usage was reported without any figure of the output:
// an OpenAI-shaped one with neither completion_tokens (output_tokens) nor total_tokens, a whole
// Anthropic answer's without output_tokens. An embedding has no output, and an Anthropic
// stream's output count is judged by outputFinal.
func (m *Meter) outputUnreported() bool {
	switch {
	case !m.res.Reported || m.format == FormatEmbeddings:
		return false
	case m.format == FormatAnthropic:
		return m.anthropicOutputMissing
	}
	return !m.reported[figCompletion].seen && !m.reported[figTotal].seen
}

// UpstreamError reports whether the response carried an error event or object so far: cheap
// enough for every event.
func (m *Meter) UpstreamError() bool { return m.res.UpstreamError }

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

// responsesEvent handles one OpenAI Responses API event of type typ.
func (m *Meter) responsesEvent(s, typ string) {
	switch typ {
	case "response.created":
		keepName(&m.res.Model, gjson.Get(s, "response.model"), false)
		keepName(&m.res.ResponseID, gjson.Get(s, "response.id"), false)
	case "response.completed", "response.incomplete":
		// The finished response names the model that produced it: it overrides the one
		// response.created named (a router's pick is known only at the end).
		keepName(&m.res.Model, gjson.Get(s, "response.model"), true)
		m.openAIUsage(gjson.Get(s, "response.usage"))
	case "response.failed":
		// A failed response carries what it used so far, and the model that used it, as a
		// completed one does.
		m.res.UpstreamError = true
		keepName(&m.res.Model, gjson.Get(s, "response.model"), true)
		m.openAIUsage(gjson.Get(s, "response.usage"))
	case "error":
		m.res.UpstreamError = true
	case "response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta",
		"response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
		"response.custom_tool_call_input.delta", "response.code_interpreter_call_code.delta",
		"response.mcp_call_arguments.delta", "response.shell_call_command.delta":
		// The model's words: its text, reasoning, tool arguments and the commands it writes
		// for the shell tool. (A hosted tool's own output, such as the shell's, is not.)
		m.res.OutputChars += strLen(gjson.Get(s, "delta"))
	case "response.apply_patch_call_operation_diff.delta":
		m.patchDeltas = true
		m.res.OutputChars += strLen(gjson.Get(s, "delta"))
	case "response.output_item.added":
		m.sawItemID(gjson.Get(s, "item.id"))
	case "response.output_item.done":
		m.sawItemID(gjson.Get(s, "item.id"))
		switch gjson.Get(s, "item.type").Str {
		case "apply_patch_call":
			// A patch the model wrote may come whole, in its item, with no deltas before it.
			if !m.patchDeltas {
				m.res.OutputChars += strLen(gjson.Get(s, "item.operation.diff"))
			}
		case "mcp_approval_request":
			// An MCP tool call waiting for approval comes whole, with no deltas before it.
			m.res.OutputChars += strLen(gjson.Get(s, "item.arguments"))
		case "local_shell_call":
			// So does a local shell's command.
			gjson.Get(s, "item.action").Get("command").ForEach(func(_, c gjson.Result) bool {
				m.res.OutputChars += strLen(c)
				return true
			})
		}
	}
}

// anthropicEvent handles one Anthropic Messages event of type typ.
func (m *Meter) anthropicEvent(s, typ string) {
	switch typ {
	case "message_start":
		// Anthropic's message_start counts the prompt. The shims that serve other models in
		// its format open with a placeholder of zeros ({"input_tokens":0,"output_tokens":0})
		// and count the call in message_delta: read as a report, a stream of theirs cut before
		// message_delta had its prompt charged at 0. It is none, as an empty usage is none.
		if u := gjson.Get(s, "message.usage"); u.IsObject() && !anthropicCountsNothing(u) {
			m.anthropicUsage(u)
		}
		keepName(&m.res.Model, gjson.Get(s, "message.model"), false)
	case "message_delta":
		// With no report before it (message_start's of zeros is none), a usage of zeros is no
		// report either: a shim that counts nothing had the whole answer charged 0, where it
		// is estimated. After a real message_start, a delta's output of 0 is final (an answer
		// that made nothing).
		if u := gjson.Get(s, "usage"); u.IsObject() && (m.res.Reported || !anthropicCountsNothing(u)) && m.anthropicUsage(u) {
			m.outputFinal = true
		}
	case "content_block_delta":
		d := gjson.Get(s, "delta")
		switch d.Get("type").Str {
		case "text_delta":
			m.res.OutputChars += strLen(d.Get("text"))
		case "thinking_delta":
			m.res.OutputChars += strLen(d.Get("thinking"))
		case "input_json_delta":
			m.res.OutputChars += strLen(d.Get("partial_json"))
		case "compaction_delta":
			m.res.OutputChars += strLen(d.Get("content"))
		}
	case "error":
		m.res.UpstreamError = true
	}
}

// anthropicFields are Anthropic's usage fields in the order of pricing.Usage's fields, then
// the five-minute writes. input_tokens already excludes both kinds of cache tokens;
// cache_creation_input_tokens counts the five-minute and the one-hour writes, which
// cache_creation breaks out.
var anthropicFields = [6]string{"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens",
	"cache_creation.ephemeral_1h_input_tokens", "cache_creation.ephemeral_5m_input_tokens"}

// anthropicOutput is output_tokens' index in anthropicFields.
const anthropicOutput = 3

// anthropicCountsNothing reports whether u, an Anthropic usage, gives no figure above 0, at its
// top level or in its iterations.
func anthropicCountsNothing(u gjson.Result) bool {
	zeros := func(v gjson.Result) bool {
		for _, f := range anthropicFields {
			if n, _ := first(v, f); n > 0 {
				return false
			}
		}
		return true
	}
	nothing := zeros(u)
	u.Get("iterations").ForEach(func(_, it gjson.Result) bool {
		nothing = nothing && zeros(it)
		return nothing
	})
	return nothing
}

// anthropicUsage applies one Anthropic usage object: each field present replaces the one
// before (message_delta carries cumulative counts). With iterations[] (compaction, server
// tools) the top-level fields describe only the last iteration, so each field is the sum
// over the iterations instead.
//
// A top-level 0 does not replace an earlier count of the prompt side (input, cache reads and
// writes): a cumulative count cannot fall to nothing, and Anthropic-compatible servers
// (SGLang's /v1/messages, among others) send message_delta's input_tokens as 0 after
// message_start gave the count. Replaced, the prompt was billed at 0. The output's 0 still
// replaces message_start's placeholder, but not a final count (outputFinal) above 0. It
// reports whether u gave a count of the output (at the top or in an iteration): one that did
// not says nothing of it.
func (m *Meter) anthropicUsage(u gjson.Result) (outputCounted bool) {
	var sum [len(anthropicFields)]int64
	var inIter, top [len(anthropicFields)]bool
	u.Get("iterations").ForEach(func(_, it gjson.Result) bool {
		for i, f := range anthropicFields {
			if v, ok := first(it, f); ok {
				sum[i] = min(sum[i]+v, pricing.MaxTokens)
				inIter[i] = true
			}
		}
		return true
	})
	fields := [len(anthropicFields)]*int64{&m.res.Usage.Input, &m.res.Usage.CacheRead, &m.res.Usage.CacheWrite, &m.res.Usage.Output,
		&m.res.Usage.CacheWrite1h, &m.res.CacheWrite5m}
	for i, f := range anthropicFields {
		if inIter[i] {
			*fields[i] = sum[i]
		} else if v, ok := first(u, f); ok {
			// The output's 0 replaces message_start's placeholder, not a final count a
			// message_delta gave before it (a proxy's second message_delta of zeros).
			if v > 0 || (i == anthropicOutput && !(m.outputFinal && *fields[i] > 0)) {
				*fields[i] = v
			}
			top[i] = true
		}
	}
	if inIter != [len(anthropicFields)]bool{} || top != [len(anthropicFields)]bool{} {
		m.res.Reported = true
	}
	m.anthropicInput = m.anthropicInput || inIter[0] || top[0]
	return inIter[anthropicOutput] || top[anthropicOutput]
}

// TrimBody is a whole body without the white space around it or a leading UTF-8 byte order
// mark. RFC 8259 forbids the mark, but servers on some stacks write one and clients read past
// it (Python's json, under the OpenAI SDK): kept, it hid the body's usage, and the call was
// charged its prompt's estimate with no output at all.
func TrimBody(body []byte) []byte {
	return bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(body), utf8BOM))
}

// IsFinalEvent reports whether ev ends a stream of format f: [DONE] for the OpenAI formats,
// message_stop for Anthropic, and the completed, incomplete or failed response for the
// Responses API.
func IsFinalEvent(f Format, ev Event) bool {
	data := bytes.TrimSpace(ev.Data)
	switch f {
	case FormatAnthropic:
		return len(data) > 0 && data[0] == '{' && eventType(unsafeString(data), ev.Name) == "message_stop"
	case FormatResponses:
		if len(data) == 0 || data[0] != '{' {
			return false
		}
		switch eventType(unsafeString(data), ev.Name) {
		case "response.completed", "response.incomplete", "response.failed":
			return true
		}
		return false
	default:
		return bytes.Equal(data, []byte("[DONE]"))
	}
}

// FinalEventRequired reports whether every stream of format f ends with its final event
// (IsFinalEvent), so that one ending without it was cut: Anthropic's message_stop and the
// Responses API's response.completed (or incomplete, or failed) are always sent. A chat or
// completions stream's [DONE] is not: some providers end without it, and the stream is whole.
func FinalEventRequired(f Format) bool { return f == FormatAnthropic || f == FormatResponses }

// IsUsageOnlyChunk reports whether data is an OpenAI chat/completions chunk that exists only
// to carry usage (`choices` present and empty, `usage` a non-null object). The proxy removes
// such chunks from what the client sees when the client had not asked for include_usage.
// A chunk that also carries an error is not usage-only: dropping it would hide the error.
func IsUsageOnlyChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) || !hasEmptyChoices(data) {
		return false
	}
	s := unsafeString(data)
	choices := gjson.Get(s, "choices")
	if !choices.IsArray() {
		return false
	}
	empty := true
	choices.ForEach(func(_, _ gjson.Result) bool {
		empty = false
		return false
	})
	return empty && gjson.Get(s, "usage").IsObject() && !isError(gjson.Get(s, "error"))
}

// hasEmptyChoices reports whether data has a "choices" key whose value is an empty array: a
// necessary condition for a usage-only chunk, checked without parsing. It matters because
// OpenAI-style streams put "usage":null in every chunk once usage is on, so the "usage" test
// alone lets every chunk through to the parse.
func hasEmptyChoices(data []byte) bool {
	key := []byte(`"choices"`)
	for {
		i := bytes.Index(data, key)
		if i < 0 {
			return false
		}
		data = data[i+len(key):]
		rest := bytes.TrimLeft(data, " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue // a string value "choices", not the key
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) == 0 || rest[0] != '[' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) > 0 && rest[0] == ']' {
			return true
		}
	}
}

// keepName copies v into *dst when it is a name: a non-empty string no longer than
// maxModelName (longer is no name a price or a later request could match). Only the first
// unless replace. A copy: the event's memory is reused.
func keepName(dst *string, v gjson.Result, replace bool) {
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > maxModelName || (*dst != "" && !replace) {
		return
	}
	*dst = strings.Clone(v.Str)
}

// eventType is the data's "type", which both typed formats always send; the SSE event name
// stands in for it only when a relay has dropped it.
func eventType(s, name string) string {
	if t := gjson.Get(s, "type"); t.Type == gjson.String {
		return t.Str
	}
	return name
}

// first returns the first of the paths in u that holds a count (tokenCount); a null, or
// anything else that is no number, counts as absent.
func first(u gjson.Result, paths ...string) (int64, bool) {
	for _, p := range paths {
		if n, ok := tokenCount(u.Get(p)); ok {
			return n, true
		}
	}
	return 0, false
}

// tokenCount reads v as a token count: a JSON number, or a string holding one (as some
// compatible servers and proxies write them: read as absent, an Anthropic-shaped report's cache
// writes went unbilled), clamped to [0, pricing.MaxTokens] so later arithmetic cannot overflow.
// A fraction rounds up, as every figure of a charge does: truncated, 0.9 tokens were none.
func tokenCount(v gjson.Result) (int64, bool) {
	if v.Type == gjson.String {
		s := strings.TrimSpace(v.Str)
		if !gjson.Valid(s) { // Parse alone reads "n/a" as a number
			return 0, false
		}
		v = gjson.Parse(s)
	}
	if v.Type != gjson.Number {
		return 0, false
	}
	n := v.Int()
	if v.Num < pricing.MaxTokens && float64(n) < v.Num { // exact below 2^53
		n++
	}
	return max(0, min(n, pricing.MaxTokens)), true
}

// largest returns the largest of the numbers at paths in u, and whether any holds one: for a
// figure a report may give under several names at once, each the whole count.
func largest(u gjson.Result, paths ...string) (n int64, ok bool) {
	for _, p := range paths {
		if v, seen := first(u, p); seen {
			n, ok = max(n, v), true
		}
	}
	return n, ok
}

// isError reports whether a top-level "error" value is a real error: providers send
// "error": null on healthy responses.
func isError(e gjson.Result) bool {
	switch e.Type {
	case gjson.Null, gjson.False:
		return false
	case gjson.String:
		return e.Str != ""
	}
	return e.Exists()
}

// chunksLen is the byte length of the text in a message's content given as a list of chunks, as Mistral's
// reasoning models answer (in a stream's delta too): "text" chunks, and "thinking" ones whose
// thinking is text or a list of text chunks. 0 for anything but a list. Read as a string alone,
// such an answer's words were none: a stream of them cut before its usage was charged no output.
func chunksLen(v gjson.Result) int64 {
	if !v.IsArray() {
		return 0
	}
	var n int64
	v.ForEach(func(_, c gjson.Result) bool {
		n += strLen(c.Get("text"))
		if th := c.Get("thinking"); th.IsArray() {
			th.ForEach(func(_, t gjson.Result) bool {
				n += strLen(t.Get("text"))
				return true
			})
		} else {
			n += strLen(th)
		}
		return true
	})
	return n
}

// strLen is the byte length of a JSON string value, 0 for anything else.
func strLen(v gjson.Result) int64 {
	if v.Type != gjson.String {
		return 0
	}
	return int64(len(v.Str))
}

// unsafeString views b as a string without copying: gjson parses strings, and copying every
// chunk would double the hot path's allocations. Only lengths and numbers are kept from the
// results, never the strings, so nothing outlives b.
func unsafeString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
