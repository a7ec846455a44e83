package fakellm

// chat is the OpenAI chat.completion format, and with legacy set the
// text_completion format of /v1/completions: the two differ only in how a
// choice carries its text, and share every usage rule.
type chat struct {
	gen
	legacy bool
	// usageChunk: a usage-only chunk ends the stream (include_usage, or "always").
	usageChunk bool
	// prefix is every chunk up to the choices array, built once per request.
	prefix []byte
}

func newChat(g gen, legacy bool) *chat {
	c := &chat{gen: g, legacy: legacy}
	c.usageChunk = g.usage == usageAlways || (g.usage == usageOn && g.includeUsage)
	object := "chat.completion.chunk"
	if legacy {
		object = "text_completion"
	}
	b := make([]byte, 0, 160)
	b = append(b, `data: {"id":"`...)
	b = append(b, g.id...)
	b = append(b, `","object":"`+object+`","created":`+createdStr+`,"model":`...)
	b = append(b, g.model...)
	if !legacy {
		b = append(b, `,"system_fingerprint":null`...)
	}
	c.prefix = append(b, `,"choices":[`...)
	return c
}

func (c *chat) finishReason() string {
	if c.capped {
		return "length"
	}
	return "stop"
}

// appendUsage is the OpenAI usage object. cached_tokens is present (and 0)
// because the gateway's billing reads it, and its absence is a different case.
func appendUsage(b []byte, prompt, completion int64) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = appendInt(b, prompt)
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, completion)
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, prompt+completion)
	return append(b, `,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}`...)
}

// endChunk closes a chunk after its choices: OpenAI sends "usage":null on every
// chunk once include_usage is on, and xAI a cumulative usage.
func (c *chat) endChunk(b []byte, done int64) []byte {
	switch {
	case c.usage == usageEveryChunk:
		b = append(b, `],"usage":`...)
		b = appendUsage(b, c.prompt, done)
		return append(b, "}\n\n"...)
	case c.usageChunk:
		return append(b, `],"usage":null}`+"\n\n"...)
	default:
		return append(b, "]}\n\n"...)
	}
}

func (c *chat) head(e *emitter) {
	if c.legacy {
		return // text completions have no role chunk
	}
	e.b = append(e.b, c.prefix...)
	e.b = append(e.b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`...)
	e.b = c.endChunk(e.b, 0)
	e.flush()
}

func (c *chat) delta(e *emitter, i int64) {
	e.b = append(e.b, c.prefix...)
	if c.legacy {
		e.b = append(e.b, `{"text":"`...)
		e.b = appendWord(e.b, i)
		e.b = append(e.b, `","index":0,"logprobs":null,"finish_reason":null}`...)
	} else {
		e.b = append(e.b, `{"index":0,"delta":{"content":"`...)
		e.b = appendWord(e.b, i)
		e.b = append(e.b, `"},"logprobs":null,"finish_reason":null}`...)
	}
	e.b = c.endChunk(e.b, i)
	e.flush()
}

func (c *chat) tail(e *emitter) {
	e.b = append(e.b, c.prefix...)
	if c.legacy {
		e.b = append(e.b, `{"text":"","index":0,"logprobs":null,"finish_reason":"`...)
	} else {
		e.b = append(e.b, `{"index":0,"delta":{},"logprobs":null,"finish_reason":"`...)
	}
	e.b = append(e.b, c.finishReason()...)
	e.b = append(e.b, `"}`...)
	e.b = c.endChunk(e.b, c.n)
	if !e.flush() {
		return
	}
	if c.usageChunk {
		e.b = append(e.b, c.prefix...)
		e.b = append(e.b, `],"usage":`...)
		e.b = appendUsage(e.b, c.prompt, c.n)
		e.b = append(e.b, "}\n\n"...)
		if !e.flush() {
			return
		}
	}
	e.b = append(e.b, "data: [DONE]\n\n"...)
	e.flush()
}

func (c *chat) fail(e *emitter, _ int64) {
	e.b = append(e.b, `data: {"error":{"message":"fake upstream error","type":"server_error"}}`+"\n\n"...)
	e.flush()
}

func (c *chat) whole(b []byte) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, c.id...)
	if c.legacy {
		b = append(b, `","object":"text_completion","created":`+createdStr+`,"model":`...)
		b = append(b, c.model...)
		b = append(b, `,"choices":[{"text":"`...)
		b = appendText(b, c.n)
		b = append(b, `","index":0,"logprobs":null,"finish_reason":"`...)
	} else {
		b = append(b, `","object":"chat.completion","created":`+createdStr+`,"model":`...)
		b = append(b, c.model...)
		b = append(b, `,"system_fingerprint":null,"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		b = appendText(b, c.n)
		b = append(b, `","refusal":null},"logprobs":null,"finish_reason":"`...)
	}
	b = append(b, c.finishReason()...)
	b = append(b, `"}]`...)
	if c.usage != usageOff {
		b = append(b, `,"usage":`...)
		b = appendUsage(b, c.prompt, c.n)
	}
	return append(b, "}\n"...)
}
