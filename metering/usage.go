package metering

import (
	"bytes"

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
	// ModelAsked is set when Model is only what a Responses stream's start
	// (response.created) named — the model asked for, a router's alias — and no final event
	// (response.completed, .incomplete, .failed) has named the one that produced the answer:
	// on a call a router may answer with any of its fallbacks, no word of which one did (see
	// proxy's settlementAs).
	ModelAsked bool
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
