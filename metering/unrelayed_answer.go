package metering

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
