package metering

import (
	"unicode"
	"unicode/utf8"
)

// An UnrelayedAnswer's bytes outside strings: the lead before the answer, the containers that
// open and close, and the raw JSON of values counted by their bytes.

// rawKind is the kind of a value whose raw JSON counts: where it ends.
type rawKind uint8

const (
	rawNone      rawKind = iota
	rawString            // at its closing quote
	rawContainer         // at the bracket that closes it
	rawLiteral           // a number, true, false or null: before the byte that follows it
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

// rawBegins starts counting the raw JSON of a value of kind k that begins at the byte read.
func (b *UnrelayedAnswer) rawBegins(k rawKind) {
	b.raw, b.rawStart, b.rawDepth = k, b.at, b.depth
}

// rawEnds counts the raw JSON of the value being counted, which ends before offset end.
func (b *UnrelayedAnswer) rawEnds(end int64) {
	b.textBytes += end - b.rawStart
	b.raw = rawNone
}
