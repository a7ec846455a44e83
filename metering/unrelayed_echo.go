package metering

// The echo of a completions call's prompts at the start of its choices' text, which is no output.

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
