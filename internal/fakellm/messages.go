package fakellm

// messages is the Anthropic Messages format. Anthropic always reports usage:
// input on message_start (with output_tokens 1, as the real API does), the
// final output on message_delta, whose fields replace the earlier ones. Only
// "off" changes that (no usage anywhere); "always" and "every-chunk" are "on".
type messages struct {
	gen
}

func (m *messages) stopReason() string {
	if m.capped {
		return "max_tokens"
	}
	return "end_turn"
}

func (m *messages) usageObj(b []byte, output int64) []byte {
	b = append(b, `{"input_tokens":`...)
	b = appendInt(b, m.prompt)
	b = append(b, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":`...)
	b = appendInt(b, output)
	return append(b, '}')
}

func (m *messages) open(b []byte, content bool) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, m.id...)
	b = append(b, `","type":"message","role":"assistant","model":`...)
	b = append(b, m.model...)
	b = append(b, `,"content":[`...)
	if content {
		b = append(b, `{"type":"text","text":"`...)
		b = appendText(b, m.n)
		b = append(b, `"}],"stop_reason":"`...)
		b = append(b, m.stopReason()...)
		b = append(b, `","stop_sequence":null`...)
	} else {
		b = append(b, `],"stop_reason":null,"stop_sequence":null`...)
	}
	return b
}

func (m *messages) head(e *emitter) {
	e.b = append(e.b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"...)
	e.b = m.open(e.b, false)
	if m.usage != usageOff {
		e.b = append(e.b, `,"usage":`...)
		// Never more than the answer, even at the start: an answer of
		// max_tokens 0 must not report one token.
		e.b = m.usageObj(e.b, min(1, m.n))
	}
	e.b = append(e.b, "}}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = append(e.b, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = append(e.b, "event: ping\ndata: {\"type\":\"ping\"}\n\n"...)
	e.flush()
}

func (m *messages) delta(e *emitter, i int64) {
	e.b = append(e.b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""...)
	e.b = appendWord(e.b, i)
	e.b = append(e.b, "\"}}\n\n"...)
	e.flush()
}

func (m *messages) tail(e *emitter) {
	e.b = append(e.b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = append(e.b, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
	e.b = append(e.b, m.stopReason()...)
	e.b = append(e.b, `","stop_sequence":null}`...)
	if m.usage != usageOff {
		e.b = append(e.b, `,"usage":{"output_tokens":`...)
		e.b = appendInt(e.b, m.n)
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, "}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = append(e.b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
	e.flush()
}

func (m *messages) fail(e *emitter, _ int64) {
	e.b = append(e.b, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"fake upstream error\"}}\n\n"...)
	e.flush()
}

func (m *messages) whole(b []byte) []byte {
	b = m.open(b, true)
	if m.usage != usageOff {
		b = append(b, `,"usage":`...)
		b = m.usageObj(b, m.n)
	}
	return append(b, "}\n"...)
}
