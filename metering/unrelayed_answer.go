package metering

import (
	"bytes"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// An answer too large to relay is never held whole: it is read past for its usage report
// (proxy's meterOversized), and a spoken answer's audio, most of its bytes, went unmeasured. A
// report that does not split out the audio then had it charged at the text price, where the
// same answer read whole had its audio estimated and charged at the audio price (Result). An
// UnrelayedAnswer measures that audio as the bytes go by, as Meter.Body does a whole answer's,
// in a few KiB whatever its length. An answer read past to its end without a usage report was
// charged its prompt's estimate alone, where the same answer read whole has its output
// estimated from its text and audio: an UnrelayedAnswer counts that text too (OutputChars's
// bytes), for the Meter to estimate when no report came (AddUnreported), in every format the
// Meter reads a whole answer of: an Anthropic message's or a Responses answer too.

// UnrelayedAnswer finds the spoken answers (choices[].message.audio.data) of a whole chat
// answer written to it in pieces and measures each as Meter.Body does (spokenAnswer): a WAV or MP3
// file by how long it plays, any other data as raw PCM. It keeps a few KiB of each, never the
// audio. It counts the bytes of the text Meter.Body counts as well: a chat message's content
// (a string, or a list of chunks), reasoning_content and reasoning (the larger of the two, one
// text under two names) and refusal, its tool calls' and function_call's arguments, its
// custom tool calls' input, its audio's transcript, or a legacy completion's choices[].text
// (openAIChoices); an Anthropic message's content blocks' text and thinking, a compaction
// block's content, and the raw JSON of their input; a Responses answer's output items'
// arguments, custom tool input, code interpreter code, shell commands (a local shell's
// command) and patch diff, their content parts' text and refusal, and their reasoning
// summaries' text. It reads JSON as gjson does a valid body; on one that is not, it measures
// what it can (such an answer read whole is refused, never metered).
type UnrelayedAnswer struct {
	started, done bool    // the first byte that is not space or a BOM was seen; the top value ended
	bom           bool    // the leading BOM TrimBody trims was seen
	lead          [4]byte // a rune of the lead begun, not yet whole
	nlead         int
	depth         int // containers open
	frames        [answerDepth]answerFrame
	pending       uint8 // what the next value is, by its key or position (roleNone when nothing)
	// The string being read: inString, whether it is a key (its bytes gathered in key) or the
	// audio data (its bytes measured by data), and where an escape stands.
	inString, isKey bool
	esc             int  // 0, 1 after a backslash, 2..5 reading \u's hex digits
	hex             rune // the \u digits read
	high            rune // a high surrogate waiting for its low half, or 0
	key             [answerKeyLen]byte
	keyLen          int // bytes of key gathered; past answerKeyLen the key matches none
	data            *spokenData
	counting        bool // the string being read is text whose bytes count
	// The text being counted is a completions answer's content, text only in llama.cpp's
	// server's own shape: its bytes are held in element.ownText until the answer ends.
	own bool
	// The text being counted is an Anthropic block's content whose type was not read yet: its
	// bytes are held in the block's frame until its type says whether it is a compaction.
	holding bool
	// The string being read is an Anthropic block's type: its bytes gathered in typ.
	typing bool
	// The string being read is a chat message's reasoning_content or reasoning (its role), or
	// neither (roleNone): its bytes are counted in the message's frame too.
	reasoning uint8
	typ       [len(compactionType)]byte
	typLen    int    // bytes of typ gathered; past len(typ) the type is not a compaction
	format    Format // FormatChat for an embeddings answer, read as a chat one
	// A value whose raw JSON counts (an Anthropic tool_use input) being read: of which kind,
	// where it began, and for a container the depth outside it.
	raw        rawKind
	rawStart   int64
	rawDepth   int
	off, at    int64 // the offset of the piece being read, and of the byte being read
	pcmBytes   int64
	clipMicros int64
	textBytes  int64
	// A completions call's echoed prompts (Meter.EchoPrompts): the text of choice i begins with
	// prompt i/echoPer, billed as input, not output, and counted only past it, as Meter.Body
	// counts it (completionText): i is the choice's "index" when that is a number, else its
	// position in its choices (gjson's key), and an index's echo is left out once
	// (echoSeen, as the Meter's). Which prompt is not known while the text is read: OpenAI
	// writes the index after it. So the text is counted whole as it comes, its first echoLen
	// bytes (the longest prompt's length: no more of it can be echo) kept in echoText, and
	// its echo taken back when its choice ends (echoEnds), or when the answer is cut. This
	// holds at most one prompt's length more than the call's prompts, whatever the answer's.
	// choices is how many choice objects began (wholeTasks); elements how many elements of the
	// choices being read began before the one being read, and keyPos the position its key
	// names when they are an object (-1 when it names none: no echo then, unless an index).
	echoPrompts []string
	echoPer     int64
	echoLen     int
	echoSeen    map[int64]int
	choices     int64
	elements    int64
	keyPos      int64
	choice      choiceEcho
	echoText    []byte
	echoing     bool // the string being read is the choice's text
	// firstText is textBytes when the second choice began: the text up to the end of the first
	// choice, which a llama.cpp server's report of several tasks counts alone (Meter.wholeTasks).
	firstText int64
	// A completions answer that is a JSON array of whole answers (Meter.taskAnswers): answers.
	// Each answer's report is read as the bytes go by: figure is the figure being read (its
	// literal's bytes in literal), element what the answer being read reported so far (the
	// answer itself, when it is no array: its shape, llama.cpp's server's own or not), summed
	// the sum of the reports of the answers that ended, answered how many did, and unreported
	// is set once one ended without a number for both figures.
	answers    bool
	figure     uint8
	literal    [maxFigureLiteral]byte
	litLen     int
	element    answerReport
	summed     answerReport
	answered   int64
	unreported bool
}

// choiceEcho is what tells the echo of the completions choice being read: its position, its
// index (indexNone until one is read), and whether its text began and how long it is.
type choiceEcho struct {
	pos       int64
	index     int64
	indexed   uint8
	text      bool
	textBytes int64
}

// What a choice's "index" was read as.
const (
	indexNone    uint8 = iota // none read, or no number: the position names the prompt
	indexNumber               // a number: it names the prompt
	indexTooLong              // a literal longer than maxFigureLiteral: the text is all output
)

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

// NewUnrelayedAnswer returns an UnrelayedAnswer for m's answers, or nil when it reads none of
// m's format: it reads each as Meter.Body does (an embeddings body as a chat one).
func (m *Meter) NewUnrelayedAnswer() *UnrelayedAnswer {
	switch m.format {
	case FormatChat, FormatEmbeddings:
		return &UnrelayedAnswer{format: FormatChat}
	case FormatCompletions:
		b := &UnrelayedAnswer{format: m.format, echoPrompts: m.echoPrompts, echoPer: m.echoPer}
		for _, p := range m.echoPrompts {
			b.echoLen = max(b.echoLen, len(p))
		}
		return b
	case FormatAnthropic, FormatResponses:
		return &UnrelayedAnswer{format: m.format}
	}
	return nil
}

// AddSpoken counts the audio b measured as the Meter counts a whole answer's, for an answer
// metered from its usage report alone. A whole answer's report counts all of its audio: none of
// it is audio after the report (Result).
func (m *Meter) AddSpoken(b *UnrelayedAnswer) {
	if b == nil {
		return
	}
	m.pcmBytes = min(m.pcmBytes+b.pcmBytes, maxAudioCount)
	m.clipMicros = min(m.clipMicros+b.clipMicros, maxAudioCount)
	m.pcmAtReport = min(m.pcmAtReport+b.pcmBytes, maxAudioCount)
	m.clipAtReport = min(m.clipAtReport+b.clipMicros, maxAudioCount)
}

// AddUnreported counts the audio and the text b measured as the Meter counts a whole answer's
// (Meter.Body counts its text whether or not it carries a report): for an answer read past
// without a usage report, or with one that gives no figure of the output, its output is then
// the estimate of both. It follows the Meter.Body that read the answer's report, if any.
func (m *Meter) AddUnreported(b *UnrelayedAnswer) {
	if b == nil {
		return
	}
	m.AddSpoken(b)
	m.res.OutputChars += b.textBytes
	// A whole answer's report counts all of its text, wherever in the answer it stands: none
	// of it is text after the report (Result).
	m.charsAtReport += b.textBytes
	// Unless it is a llama.cpp server's report of the first of several tasks, read as
	// Meter.Body reads it: the other choices' text is charged at its estimate.
	m.wholeTasks(b.choices, b.textBytes-b.firstText)
}

// AddServerReport charges an answer read past to its end in llama.cpp's server's own shape, its
// builds' before PR 10974, its counts, as Meter.Body charges it read whole (serverAnswer): it has
// no usage to find at its end, and was charged its prompt's estimate and, at most, its text's.
// It follows AddUnreported, which counts its text.
func (m *Meter) AddServerReport(b *UnrelayedAnswer) {
	prompt, completion, ok := b.ownReport()
	if !ok {
		return
	}
	var fresh [figureCount]reportedFigure
	fresh[figPrompt], fresh[figCompletion] = prompt, completion
	m.serverReport(0, 0, fresh)
}

// Answers reports whether the answer is a completions answer given as a JSON array of whole
// answers, each with a report of its own (Meter.taskAnswers): the report at its end is its
// last answer's alone. A nil UnrelayedAnswer reads none.
func (b *UnrelayedAnswer) Answers() bool { return b != nil && b.answers }

// AddAnswers charges an answer read to its end that is a JSON array of whole answers (Answers)
// as Meter.Body charges it read whole (taskAnswers): its text, and the sum of every answer's
// report, marked estimated, when each carried one; without a report from each, the text is
// estimated. Charged the report at its end, the last answer's, a batch of several prompts too
// large to relay paid for one.
func (m *Meter) AddAnswers(b *UnrelayedAnswer) {
	m.AddUnreported(b)
	if b.Answers() && b.answered > 0 && !b.unreported && !b.Open() {
		m.summedReport(b.summed.prompt, b.summed.cached, b.summed.completion)
	}
}

// Cut ends an answer cut before its end (read up to a bound): the value being read
// counts as far as it was read, the audio data as what it decodes to so far (a file as long as
// it plays so far) and raw JSON by its bytes read, as a stream cut midway counts what came of
// it. Nothing is read after it. A nil UnrelayedAnswer has nothing to end.
func (b *UnrelayedAnswer) Cut() {
	if b == nil || b.done {
		return
	}
	b.done = true
	if b.inString && b.data != nil {
		pcm, us := b.data.measure()
		b.pcmBytes = min(b.pcmBytes+pcm, maxAudioCount)
		b.clipMicros = min(b.clipMicros+us, maxAudioCount)
		b.data = nil
	}
	if b.raw != rawNone {
		b.rawEnds(b.off)
	}
	for i := range min(b.depth, answerDepth) {
		b.reasoningOnce(&b.frames[i])
	}
	b.echoEnds() // of the choice cut: by its index if it was read, else by its position
	if !b.element.choices && !b.element.usage {
		// A completions answer cut in its content, which comes first in llama.cpp's server's
		// own shape, before what tells one (its stop): none of an OpenAI-shaped answer's text
		// is there, and the content is the server's text.
		b.textBytes += b.element.ownText
		b.element.ownText = 0
	}
}

// Open reports whether the answer is a JSON object whose end was not read: written whole to
// its end (one a body delimited by the connection's close ends early reads as a clean end), it
// was cut short, and has no usage report of its own. A nil UnrelayedAnswer reads nothing.
func (b *UnrelayedAnswer) Open() bool {
	return b != nil && b.started && b.depth > 0
}

// Write reads the next piece of the answer; it never fails. A nil UnrelayedAnswer reads nothing.
func (b *UnrelayedAnswer) Write(p []byte) (int, error) {
	n := len(p)
	if b == nil {
		return n, nil
	}
	defer func() { b.off += int64(n) }()
	for i := 0; i < len(p) && !b.done; i++ {
		c := p[i]
		b.at = b.off + int64(i)
		if b.inString {
			if b.esc == 0 && b.high == 0 && !b.isKey && c != '"' && c != '\\' {
				// A value's plain run (most of an answer's bytes: its text, its audio), read in
				// one piece: measured when it is the audio, else skipped.
				j := plainRun(p[i:]) + i
				switch {
				case b.data != nil:
					b.data.write(unsafeString(p[i:j]))
				case b.counting:
					b.countText(p[i:j])
				case b.typing:
					for _, c := range p[i:j] {
						b.typeByte(c)
					}
				}
				i = j - 1
				continue
			}
			b.stringByte(c)
			continue
		}
		if b.started && b.offPath() {
			// Inside a container off the path to the audio (an embedding, a logprobs list):
			// nothing in it counts, and it is passed over to its next string or bracket.
			if j := i + nextStructural(p[i:]); j > i {
				i = j - 1
				continue
			}
		}
		if !b.started {
			if b.skipLead(c) {
				continue
			}
			b.started = true
			switch {
			case c == '{':
				b.pending = roleTop
			case c == '[' && b.format == FormatCompletions:
				// An older llama.cpp server's answer to a batch of prompts: a JSON array of
				// whole answers, each read as one (Meter.taskAnswers).
				b.answers, b.pending = true, roleAnswers
			default:
				b.done = true // not a JSON object: no chat answer's audio to find
				continue
			}
		}
		b.structural(c)
	}
	return n, nil
}

// rawKind is the kind of a value whose raw JSON counts: where it ends.
type rawKind uint8

const (
	rawNone      rawKind = iota
	rawString            // at its closing quote
	rawContainer         // at the bracket that closes it
	rawLiteral           // a number, true, false or null: before the byte that follows it
)

// answerDepth is how deep the paths to the audio data and text go: the answer, choices, a
// choice, its message, its tool calls, a tool call, its function (or its audio); a Responses
// answer's output, an item, its content, a part (an Anthropic message's are shallower); a
// message's content as a list of chunks, a chunk, its thinking as a list of chunks.
// Deeper containers are counted, not followed.
const answerDepth = 8

// answerKeyLen bounds the keys an UnrelayedAnswer reads: the longest it looks for is
// "reasoning_content".
const answerKeyLen = 17

// answerFrame is an open container on the path to the audio data or the text.
type answerFrame struct {
	obj, expectKey bool  // an object, and whether its next string is a key
	role           uint8 // where it stands on the path to the audio data
	// The keys read once that were seen (a choice's "message" or "text", a function's
	// "arguments", a tool call's function holding "arguments", a content block's "text"): gjson's
	// Get reads the first.
	seen uint32
	// An Anthropic block's kind, by its first "type": not read yet, a compaction (whose content
	// is output text) or any other. held counts its content's text read before its type was.
	kind uint8
	held int64
	// A chat message's text counted under reasoning_content and under reasoning: the smaller
	// is taken back when it ends (reasoningOnce).
	reasoningContent, reasoning int64
}

// compactionType is the type of an Anthropic block whose content is output text.
const compactionType = "compaction"

// An Anthropic block's kind, by its type.
const (
	kindUnread uint8 = iota
	kindCompaction
	kindOther
)

// The keys of a container that are read once, as bits of its frame's seen.
const (
	firstMain       uint32 = 1 << iota // a choice's message (text), the answer's content (output), an item's content, an action's commands, an operation's diff
	firstFunction                      // a tool call's function holding arguments
	firstArguments                     // a function's, or an item's, arguments; an action's command
	firstText                          // a content block's or a part's text
	firstThinking                      // a content block's thinking
	firstInput                         // a content block's input, a Responses item's
	firstSummary                       // a Responses item's summary
	firstRefusal                       // a Responses part's refusal
	firstType                          // a content block's type
	firstContent                       // a content block's content
	firstCode                          // a Responses item's code
	firstAction                        // a Responses item's action
	firstOperation                     // a Responses item's operation
	firstCustom                        // a chat tool call's custom (a custom tool's call)
	firstUsage                         // an array's answer's usage
	firstPrompt                        // a usage's prompt_tokens
	firstCompletion                    // a usage's completion_tokens
	firstStop                          // an answer's stop, in llama.cpp's server's own shape
	firstOwnPrompt                     // its tokens_evaluated
	firstOwnOutput                     // its tokens_predicted
	firstTimings                       // an array's answer's timings
	firstCacheN                        // their cache_n
	firstIndex                         // a completions choice's index
)

// Where a value stands on the path to the audio data.
const (
	roleNone uint8 = iota
	roleTop
	roleChoices
	roleChoice
	roleMessage
	roleAudio
	roleData
	roleText             // a string whose bytes are output text
	roleToolCalls        // a message's tool_calls
	roleToolCall         // one of them
	roleFunction         // a tool call's function, or a message's function_call: its arguments are text
	roleBlocks           // an Anthropic message's content
	roleBlock            // one of its blocks
	roleRaw              // a value whose raw JSON is output text (a block's input)
	roleOutput           // a Responses answer's output
	roleItem             // one of its items
	roleParts            // an item's content
	rolePart             // one of its parts
	roleBlockType        // a block's type: a string read to tell a compaction
	roleBlockText        // a block's content: text when the block is a compaction
	roleAction           // a Responses item's action (a shell call's)
	roleCommands         // its commands: each a string of text
	roleOperation        // a Responses item's operation (a patch's): its diff is text
	roleCustom           // a chat tool call's custom: its input is text
	roleContent          // a chat message's content: text as a string, a list of chunks as a list
	roleReasoningContent // a chat message's reasoning_content: text, counted apart (see answerFrame)
	roleReasoning        // its reasoning: text, counted apart
	// A chat message's content given as a list of chunks, as Mistral's reasoning models answer
	// (chunksLen): each chunk's text, and its thinking, a string or a list of chunks whose
	// text is text.
	roleChunks     // the list
	roleChunk      // one of its chunks
	roleChunkThink // a chunk's thinking: text as a string, a list of chunks as a list
	roleThinkList  // that list
	roleThinkChunk // one of its chunks: its text is text
	// A completions answer given as a JSON array of whole answers (Meter.taskAnswers): the
	// array, each answer's usage, and that usage's prompt_tokens and completion_tokens.
	roleAnswers
	roleUsage
	roleFigurePrompt
	roleFigureCompletion
	// Each answer's timings, and their cache_n (Meter.answerCached).
	roleTimings
	roleFigureCacheN
	// A completions answer in llama.cpp's server's own shape (Meter.serverAnswer): its content,
	// text counted apart until the answer is known to be one (answerReport.ownText), its stop,
	// tokens_evaluated and tokens_predicted.
	roleOwnText
	roleStop
	roleOwnPrompt
	roleOwnCompletion
	roleIndex // a completions choice's index: the prompt its text echoes (choiceEcho)
)

// skipLead reports whether c is part of what TrimBody trims before an answer: white space
// (Unicode's, as bytes.TrimSpace reads it) and one UTF-8 byte order mark among it. A rune
// that is neither is the answer's first, c its first byte (lead holds none of it then).
func (b *UnrelayedAnswer) skipLead(c byte) bool {
	b.lead[b.nlead] = c
	b.nlead++
	if !utf8.FullRune(b.lead[:b.nlead]) {
		return true
	}
	r, _ := utf8.DecodeRune(b.lead[:b.nlead])
	first := b.nlead == 1
	b.nlead = 0
	switch {
	case unicode.IsSpace(r):
		return true
	case r == '\ufeff' && !b.bom:
		b.bom = true
		return true
	case !first:
		b.done = true // a rune that is not space: the answer is no object
		return true
	}
	return false
}

// offPath reports whether the innermost open container is off the path to the audio data:
// nothing within it can be on the path (a value's role comes from its container's).
func (b *UnrelayedAnswer) offPath() bool {
	return b.depth > answerDepth || (b.depth > 0 && b.frames[b.depth-1].role == roleNone)
}

// structuralByte marks the bytes that open or close a string or a container.
var structuralByte = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// nextStructural is how many bytes of p come before one that opens or closes a string or a
// container.
func nextStructural(p []byte) int {
	for i, c := range p {
		if structuralByte[c] {
			return i
		}
	}
	return len(p)
}

// top is the innermost open container followed, or nil when it is deeper than answerDepth or
// none is open.
func (b *UnrelayedAnswer) top() *answerFrame {
	if b.depth == 0 || b.depth > answerDepth {
		return nil
	}
	return &b.frames[b.depth-1]
}

// structural reads a byte outside strings.
func (b *UnrelayedAnswer) structural(c byte) {
	if b.figure != figureNone {
		switch c {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			b.figureEnds()
		default:
			if b.litLen < len(b.literal) {
				b.literal[b.litLen] = c
			}
			b.litLen++
			return
		}
	}
	if b.raw == rawLiteral && (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
		// gjson's Raw of a number or a literal ends before the first of these.
		b.rawEnds(b.at)
	}
	switch c {
	case '{', '[':
		role := b.valueStarts()
		if role == roleRaw {
			b.rawBegins(rawContainer)
		}
		if role == roleChoice && c == '{' {
			if b.choices++; b.choices == 2 {
				b.firstText = b.textBytes
			}
		}
		if role == roleChoice && b.echoPrompts != nil {
			b.choiceStarts()
		}
		if role == roleChoices {
			b.elements = 0
		}
		if role == roleTop && b.answers {
			if c == '{' {
				b.element = answerReport{} // an answer of the array begins
			} else {
				role = roleNone // an element that is no answer: taskAnswers reads none of it
			}
		}
		switch {
		case role == roleContent && c == '[':
			role = roleChunks // a message's text as a list of chunks (chunksLen)
		case role == roleChunkThink && c == '[':
			role = roleThinkList
		case role == roleText || role == roleData || role == roleRaw || role == roleBlockType || role == roleBlockText ||
			role == roleChunkThink || role == roleContent || role == roleReasoningContent || role == roleReasoning ||
			role == roleFigurePrompt || role == roleFigureCompletion || role == roleFigureCacheN || role == roleOwnText || role == roleStop ||
			role == roleOwnPrompt || role == roleOwnCompletion || role == roleIndex:
			role = roleNone // text that is no string: none counts (strLen); raw JSON counts whole
		}
		b.depth++
		if f := b.top(); f != nil {
			*f = answerFrame{obj: c == '{', expectKey: c == '{', role: role}
		}
	case '}', ']':
		if b.depth == 0 {
			b.done = true
			return
		}
		f := b.top()
		b.reasoningOnce(f)
		if f != nil && f.role == roleChoice {
			b.echoEnds()
		}
		if b.answers && b.depth == 2 && f != nil && f.role == roleTop {
			b.answerEnds()
		}
		if !b.answers && b.depth == 1 && f != nil && f.role == roleTop {
			b.ownEnds() // the answer itself ends
		}
		b.depth--
		if b.raw == rawContainer && b.depth == b.rawDepth {
			b.rawEnds(b.at + 1)
		}
		if b.depth == 0 {
			b.done = true // gjson reads the first value of a body alone
		}
	case '"':
		f := b.top()
		b.inString, b.esc, b.high = true, 0, 0
		// A key matters only on the path (keyEnds); off it, where ':' and ',' are passed
		// over, every string is read as a value, in one piece.
		b.isKey = f != nil && f.obj && f.expectKey && f.role != roleNone
		if b.isKey {
			b.keyLen = 0
			return
		}
		switch role := b.valueStarts(); role {
		case roleData:
			b.data = &spokenData{}
		case roleText, roleChunkThink, roleContent:
			b.counting = true
			if role == roleText && f != nil && f.role == roleChoice && b.echoPrompts != nil {
				// Its echo is taken back when its choice ends (echoEnds).
				b.echoing, b.choice.text = true, true
			}
		case roleReasoningContent, roleReasoning:
			b.counting, b.reasoning = true, role
		case roleOwnText:
			b.counting, b.own = true, true
		case roleRaw:
			b.rawBegins(rawString)
		case roleBlockType:
			b.typing, b.typLen = true, 0
		case roleBlockText:
			// Counted as it comes when the block is a compaction, held until its type when
			// that is not read yet.
			if f != nil {
				b.counting, b.holding = f.kind != kindOther, f.kind == kindUnread
			}
		}
	case ':':
		if f := b.top(); f != nil && f.obj {
			f.expectKey = false
		}
	case ',':
		if f := b.top(); f != nil && f.obj {
			f.expectKey = true
		}
		if f := b.top(); f != nil && f.role == roleChoices {
			b.elements++ // the next element of choices is at this position
		}
		b.pending = roleNone
	case ' ', '\t', '\n', '\r':
	default:
		role := b.valueStarts()
		if role == roleRaw { // a number, true, false or null
			b.rawBegins(rawLiteral)
		} else if fig := literalFigure(role); fig != figureNone {
			b.figure, b.litLen = fig, 0
			b.structural(c)
		}
	}
}

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
		// As the Meter reads them: an answer of an array as taskAnswers (a number's Int), the
		// answer itself as serverAnswer (tokenCount).
		n, _ := tokenCount(v)
		if b.answers {
			n = v.Int()
		}
		b.element.own[fig-figureOwnPrompt] = reportedFigure{n: n, seen: true}
	case figurePrompt:
		b.element.prompt, b.element.promptSeen = v.Int(), true
	case figureCompletion:
		b.element.completion, b.element.completionSeen = v.Int(), true
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

// rawBegins starts counting the raw JSON of a value of kind k that begins at the byte read.
func (b *UnrelayedAnswer) rawBegins(k rawKind) {
	b.raw, b.rawStart, b.rawDepth = k, b.at, b.depth
}

// rawEnds counts the raw JSON of the value being counted, which ends before offset end.
func (b *UnrelayedAnswer) rawEnds(end int64) {
	b.textBytes += end - b.rawStart
	b.raw = rawNone
}

// valueStarts returns the role of the value that starts here, and clears it: an element (or
// value) of choices is a choice, of tool_calls a tool call, a value is what its key made it
// (keyEnds).
func (b *UnrelayedAnswer) valueStarts() uint8 {
	role := b.pending
	b.pending = roleNone
	if f := b.top(); f != nil {
		// gjson's ForEach reads an object's values as an array's elements.
		switch f.role {
		case roleChoices:
			role = roleChoice
		case roleToolCalls:
			role = roleToolCall
		case roleBlocks:
			role = roleBlock
		case roleOutput:
			role = roleItem
		case roleParts:
			role = rolePart
		case roleCommands:
			role = roleText
		case roleChunks:
			role = roleChunk
		case roleThinkList:
			role = roleThinkChunk
		case roleAnswers:
			role = roleTop
		}
	}
	return role
}

// keyEnds sets what the value of the key just read is on the paths to the audio data and the
// text, as openAIObject, openAIChoices and spokenAnswer read a whole answer: every "choices"
// of the answer, the first "message" of a choice (its first "text" in a legacy completion),
// every "audio" of a message and every "data" and "transcript" of an audio, every "content",
// "reasoning_content", "reasoning", "refusal", "tool_calls" and "function_call" of a message,
// the first "function" of a tool call and the first "arguments" of a function, the first
// "input" of a tool call's first "custom". As Meter.Body reads an Anthropic message: the first
// "content" of the answer, and of each of its blocks the first "text", "thinking" and "input",
// and the first "content" when its first "type" is "compaction"; a Responses answer: the first
// "output" of the answer, of each of its items the first "arguments", "input", "content",
// "summary" and "code", the elements of the first "commands" and of the first "command" of its
// first "action" and the first "diff" of its first "operation", of each part the first "text"
// and "refusal".
func (b *UnrelayedAnswer) keyEnds() {
	f := b.top()
	if f != nil && f.role == roleChoices {
		// Choices given as an object: gjson's key of each is its key, read as a number.
		b.keyPos = -1
		if b.keyLen <= answerKeyLen {
			b.keyPos = gjson.Result{Type: gjson.String, Str: string(b.key[:b.keyLen])}.Int()
		}
	}
	if f == nil || b.keyLen > answerKeyLen {
		return
	}
	key := string(b.key[:b.keyLen])
	first := func(bit uint32, role uint8) {
		if f.seen&bit == 0 {
			b.pending = role
		}
		f.seen |= bit
	}
	switch f.role {
	case roleTop:
		if b.format == FormatCompletions {
			// What tells an answer in llama.cpp's server's own shape (answerReport.serverOwn),
			// and its keys.
			switch key {
			case "choices":
				b.element.choices = true
			case "usage":
				b.element.usage = true
			case "content":
				first(firstContent, roleOwnText)
			case "stop":
				first(firstStop, roleStop)
			case "tokens_evaluated":
				first(firstOwnPrompt, roleOwnPrompt)
			case "tokens_predicted":
				first(firstOwnOutput, roleOwnCompletion)
			}
		}
		switch {
		case b.format == FormatAnthropic && key == "content":
			first(firstMain, roleBlocks)
		case b.format == FormatResponses && key == "output":
			first(firstMain, roleOutput)
		case b.answers && key == "choices":
			first(firstMain, roleChoices) // a.Get("choices"), as taskAnswers reads an answer
		case (b.format == FormatChat || b.format == FormatCompletions) && key == "choices":
			b.pending = roleChoices
		case b.answers && key == "usage":
			first(firstUsage, roleUsage)
		case b.answers && key == "timings":
			first(firstTimings, roleTimings) // a.Get("timings").Get("cache_n"), as taskAnswers reads it
		}
	case roleTimings:
		if key == "cache_n" {
			first(firstCacheN, roleFigureCacheN)
		}
	case roleUsage:
		switch key {
		case "prompt_tokens":
			first(firstPrompt, roleFigurePrompt)
		case "completion_tokens":
			first(firstCompletion, roleFigureCompletion)
		}
	case roleChoice:
		if b.format == FormatCompletions && key == "text" {
			first(firstMain, roleText)
		} else if b.format == FormatCompletions && key == "index" {
			first(firstIndex, roleIndex) // c.Get("index"), as completionText reads it
		} else if b.format == FormatChat && key == "message" {
			first(firstMain, roleMessage)
		}
	case roleMessage:
		switch key {
		case "audio":
			b.pending = roleAudio
		case "content":
			b.pending = roleContent
		case "reasoning_content":
			b.pending = roleReasoningContent
		case "reasoning":
			b.pending = roleReasoning
		case "refusal":
			b.pending = roleText
		case "tool_calls":
			b.pending = roleToolCalls
		case "function_call":
			b.pending = roleFunction
		}
	case roleAudio:
		switch key {
		case "data":
			b.pending = roleData
		case "transcript":
			b.pending = roleText
		}
	case roleToolCall:
		// tc.Get("function.arguments") reads the first "arguments" of the first "function"
		// that is an object holding one: each "function" is read until one has held arguments
		// (roleFunction then marks this tool call firstFunction), none after it.
		switch {
		case key == "function" && f.seen&firstFunction == 0:
			b.pending = roleFunction
		case key == "custom":
			first(firstCustom, roleCustom)
		}
	case roleCustom:
		if key == "input" {
			first(firstInput, roleText)
		}
	case roleFunction:
		if key == "arguments" {
			first(firstArguments, roleText)
			if b.depth >= 2 && b.frames[b.depth-2].role == roleToolCall {
				b.frames[b.depth-2].seen |= firstFunction
			}
		}
	case roleBlock:
		switch key {
		case "text":
			first(firstText, roleText)
		case "thinking":
			first(firstThinking, roleText)
		case "input":
			first(firstInput, roleRaw)
		case "type":
			first(firstType, roleBlockType)
			if b.pending == roleBlockType {
				f.kind = kindOther // unless it is the string "compaction"
			}
		case "content":
			first(firstContent, roleBlockText)
		}
	case roleItem:
		switch key {
		case "arguments":
			first(firstArguments, roleText)
		case "input": // a custom tool call's
			first(firstInput, roleText)
		case "content":
			first(firstMain, roleParts)
		case "summary": // a reasoning item's
			first(firstSummary, roleParts)
		case "code": // a code interpreter call's
			first(firstCode, roleText)
		case "action":
			first(firstAction, roleAction)
		case "operation":
			first(firstOperation, roleOperation)
		}
	case roleAction:
		switch key {
		case "commands": // a shell call's
			first(firstMain, roleCommands)
		case "command": // a local shell call's
			first(firstArguments, roleCommands)
		}
	case roleOperation:
		if key == "diff" {
			first(firstMain, roleText)
		}
	case rolePart:
		switch key {
		case "text":
			first(firstText, roleText)
		case "refusal":
			first(firstRefusal, roleText)
		}
	case roleChunk:
		switch key {
		case "text":
			first(firstText, roleText)
		case "thinking":
			first(firstThinking, roleChunkThink)
		}
	case roleThinkChunk:
		if key == "text" {
			first(firstText, roleText)
		}
	}
}

// stringByte reads a byte of a string: its end, an escape, or a byte of its text.
func (b *UnrelayedAnswer) stringByte(c byte) {
	if b.high != 0 && b.esc == 0 && c != '\\' {
		b.lone() // a high surrogate no \u follows
	}
	switch {
	case b.esc == 1:
		b.esc = 0
		if c == 'u' {
			b.esc, b.hex = 2, 0
			return
		}
		if b.high != 0 {
			b.lone()
		}
		switch c {
		case 'b':
			b.text('\b')
		case 'f':
			b.text('\f')
		case 'n':
			b.text('\n')
		case 'r':
			b.text('\r')
		case 't':
			b.text('\t')
		default: // ", \ and /
			b.text(c)
		}
	case b.esc >= 2:
		switch {
		case '0' <= c && c <= '9':
			b.hex = b.hex<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			b.hex = b.hex<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			b.hex = b.hex<<4 | rune(c-'A'+10)
		}
		if b.esc++; b.esc == 6 {
			b.esc = 0
			b.escapedRune(b.hex)
		}
	case c == '\\':
		b.esc = 1
	case c == '"':
		b.inString, b.counting, b.holding, b.reasoning, b.echoing, b.own = false, false, false, roleNone, false, false
		if b.typing {
			b.typing = false
			if f := b.top(); f != nil && b.typLen == len(b.typ) && string(b.typ[:]) == compactionType {
				f.kind = kindCompaction
				b.textBytes += f.held
			}
		}
		if b.raw == rawString {
			b.rawEnds(b.at + 1)
		}
		if b.isKey {
			b.keyEnds()
		} else if b.data != nil {
			pcm, us := b.data.measure()
			b.pcmBytes = min(b.pcmBytes+pcm, maxAudioCount)
			b.clipMicros = min(b.clipMicros+us, maxAudioCount)
			b.data = nil
		}
	default:
		b.text(c)
	}
}

// escapedRune adds a \u escape's rune, pairing surrogates as gjson does: a high one waits for
// the low one that may follow it; alone, either is U+FFFD.
func (b *UnrelayedAnswer) escapedRune(r rune) {
	if b.high != 0 {
		h := b.high
		b.high = 0
		if 0xDC00 <= r && r < 0xE000 {
			b.runeText(0x10000 + (h-0xD800)<<10 + (r - 0xDC00))
			return
		}
		b.runeText(utf8.RuneError)
	}
	if 0xD800 <= r && r < 0xDC00 {
		b.high = r
		return
	}
	b.runeText(r)
}

// lone adds a high surrogate that no low one followed.
func (b *UnrelayedAnswer) lone() {
	b.high = 0
	b.runeText(utf8.RuneError)
}

func (b *UnrelayedAnswer) runeText(r rune) {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	for _, c := range buf[:n] {
		b.text(c)
	}
}

// text adds one byte of a string's text to the key or the audio data being read.
func (b *UnrelayedAnswer) text(c byte) {
	switch {
	case b.isKey:
		if b.keyLen < answerKeyLen {
			b.key[b.keyLen] = c
		}
		b.keyLen = min(b.keyLen+1, answerKeyLen+1)
	case b.data != nil:
		one := [1]byte{c}
		b.data.write(string(one[:]))
	case b.counting:
		one := [1]byte{c}
		b.countText(one[:])
	case b.typing:
		b.typeByte(c)
	}
}

// choiceStarts begins a completions choice of a call with echo: its position in its choices,
// as gjson's ForEach keys it (every element counts, an object or not; an object's key read as
// a number), no index read yet, and no text.
func (b *UnrelayedAnswer) choiceStarts() {
	pos := b.elements
	if f := b.top(); f != nil && f.obj { // choices, the choice's container
		pos = b.keyPos
	}
	b.choice = choiceEcho{pos: pos}
	b.echoText = b.echoText[:0]
}

// echoEnds takes back the echo of the completions choice that ends (or is cut) from the text
// counted, as completionText leaves it out: the prompt its index names, or its position when
// it names none, as far as the text is that prompt byte for byte, and of each index once. Its
// text is all output where it parts from the prompt, where the index names none of the call's
// prompts, or once the index's echo was read.
func (b *UnrelayedAnswer) echoEnds() {
	c := b.choice
	b.choice = choiceEcho{}
	if !c.text || c.textBytes == 0 || c.indexed == indexTooLong || b.echoPer < 1 {
		return
	}
	i := c.pos
	if c.indexed == indexNumber {
		i = c.index
	}
	if i < 0 || i/b.echoPer >= int64(len(b.echoPrompts)) {
		return
	}
	prompt := b.echoPrompts[i/b.echoPer]
	if b.echoSeen == nil {
		b.echoSeen = make(map[int64]int) // one entry an index of the call's: its prompts times n at most
	}
	seen := b.echoSeen[i]
	if seen < 0 || seen >= len(prompt) {
		return
	}
	n := int(min(c.textBytes, int64(len(prompt)-seen)))
	if string(b.echoText[:n]) != prompt[seen:seen+n] {
		b.echoSeen[i] = -1 // no echo: all of it is the model's
		return
	}
	b.echoSeen[i] = seen + n
	b.textBytes -= int64(n)
}

// countText counts s, the next bytes of the text being read; of a choice's text that may
// begin with its echo, it keeps the bytes that may be echo for echoEnds to match.
func (b *UnrelayedAnswer) countText(s []byte) {
	if b.echoing {
		b.choice.textBytes += int64(len(s))
		if room := b.echoLen - len(b.echoText); room > 0 {
			b.echoText = append(b.echoText, s[:min(len(s), room)]...)
		}
	}
	b.count(int64(len(s)))
}

// count adds n bytes of text: to the answer's, or held in the innermost frame, a block whose
// type is not read yet.
func (b *UnrelayedAnswer) count(n int64) {
	f := b.top()
	if b.holding && f != nil {
		f.held += n
		return
	}
	if b.own {
		b.element.ownText += n // text once the answer is known to be in the server's own shape
		return
	}
	b.textBytes += n
	switch {
	case f == nil:
	case b.reasoning == roleReasoningContent:
		f.reasoningContent += n
	case b.reasoning == roleReasoning:
		f.reasoning += n
	}
}

// reasoningOnce takes back, for the message f closes (or the answer is cut inside of), the
// smaller of its reasoning_content and its reasoning: the same text under both names counts
// once (openAIChoices).
func (b *UnrelayedAnswer) reasoningOnce(f *answerFrame) {
	if f != nil && f.role == roleMessage {
		b.textBytes -= min(f.reasoningContent, f.reasoning)
		f.reasoningContent, f.reasoning = 0, 0
	}
}

// typeByte gathers one byte of a block's type.
func (b *UnrelayedAnswer) typeByte(c byte) {
	if b.typLen < len(b.typ) {
		b.typ[b.typLen] = c
	}
	b.typLen = min(b.typLen+1, len(b.typ)+1)
}

// plainRun is how many bytes of p, a string's text, come before its end or an escape.
func plainRun(p []byte) int {
	end := bytes.IndexByte(p, '"')
	if end < 0 {
		end = len(p)
	}
	if esc := bytes.IndexByte(p[:end], '\\'); esc >= 0 {
		return esc
	}
	return end
}
