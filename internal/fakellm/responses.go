package fakellm

// responses is the OpenAI Responses API format. Usage rides only on the final
// response.completed (or response.incomplete when max_output_tokens cut the
// answer, which is where the gateway must find it too); "always" and
// "every-chunk" behave as "on", since this API has no per-chunk usage.
type responses struct {
	gen
	itemID string
}

// Events 0..3 open the stream, content chunk i is event 3+i, and the tail
// starts at 4+n: sequence numbers follow from the position alone.
const responsesHead = 4

func (x *responses) status() string {
	if x.capped {
		return "incomplete"
	}
	return "completed"
}

func (x *responses) event(b []byte, typ string, seq int64) []byte {
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: {\"type\":\""...)
	b = append(b, typ...)
	b = append(b, `","sequence_number":`...)
	return appendInt(b, seq)
}

// item is the output message; final includes its text and end status.
func (x *responses) item(b []byte, final bool) []byte {
	b = append(b, `{"id":"`...)
	b = append(b, x.itemID...)
	if !final {
		return append(b, `","type":"message","status":"in_progress","role":"assistant","content":[]}`...)
	}
	b = append(b, `","type":"message","status":"`...)
	b = append(b, x.status()...)
	b = append(b, `","role":"assistant","content":[`...)
	b = x.part(b, true)
	return append(b, "]}"...)
}

func (x *responses) part(b []byte, final bool) []byte {
	b = append(b, `{"type":"output_text","annotations":[],"text":"`...)
	if final {
		b = appendText(b, x.n)
	}
	return append(b, `"}`...)
}

// response is the response object; status "in_progress", "failed" or the final one.
func (x *responses) response(b []byte, status string) []byte {
	final := status == "completed" || status == "incomplete"
	b = append(b, `{"id":"`...)
	b = append(b, x.id...)
	b = append(b, `","object":"response","created_at":`+createdStr+`,"status":"`...)
	b = append(b, status...)
	b = append(b, `","model":`...)
	b = append(b, x.model...)
	b = append(b, `,"output":[`...)
	if final {
		b = x.item(b, true)
	}
	b = append(b, `],"error":`...)
	if status == "failed" {
		b = append(b, `{"code":"server_error","message":"fake upstream error"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"incomplete_details":`...)
	if status == "incomplete" {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"usage":`...)
	if final && x.usage != usageOff {
		b = append(b, `{"input_tokens":`...)
		b = appendInt(b, x.prompt)
		b = append(b, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		b = appendInt(b, x.n)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = appendInt(b, x.prompt+x.n)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

func (x *responses) head(e *emitter) {
	for seq, typ := range [...]string{"response.created", "response.in_progress"} {
		e.b = x.event(e.b, typ, int64(seq))
		e.b = append(e.b, `,"response":`...)
		e.b = x.response(e.b, "in_progress")
		e.b = append(e.b, "}\n\n"...)
		if !e.flush() {
			return
		}
	}
	e.b = x.event(e.b, "response.output_item.added", 2)
	e.b = append(e.b, `,"output_index":0,"item":`...)
	e.b = x.item(e.b, false)
	e.b = append(e.b, "}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = x.event(e.b, "response.content_part.added", 3)
	e.b = x.itemRef(e.b)
	e.b = append(e.b, `,"part":`...)
	e.b = x.part(e.b, false)
	e.b = append(e.b, "}\n\n"...)
	e.flush()
}

func (x *responses) itemRef(b []byte) []byte {
	b = append(b, `,"item_id":"`...)
	b = append(b, x.itemID...)
	return append(b, `","output_index":0,"content_index":0`...)
}

func (x *responses) delta(e *emitter, i int64) {
	e.b = x.event(e.b, "response.output_text.delta", responsesHead-1+i)
	e.b = x.itemRef(e.b)
	e.b = append(e.b, `,"delta":"`...)
	e.b = appendWord(e.b, i)
	e.b = append(e.b, "\"}\n\n"...)
	e.flush()
}

func (x *responses) tail(e *emitter) {
	seq := responsesHead + x.n
	e.b = x.event(e.b, "response.output_text.done", seq)
	e.b = x.itemRef(e.b)
	e.b = append(e.b, `,"text":"`...)
	e.b = appendText(e.b, x.n)
	e.b = append(e.b, "\"}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = x.event(e.b, "response.content_part.done", seq+1)
	e.b = x.itemRef(e.b)
	e.b = append(e.b, `,"part":`...)
	e.b = x.part(e.b, true)
	e.b = append(e.b, "}\n\n"...)
	if !e.flush() {
		return
	}
	e.b = x.event(e.b, "response.output_item.done", seq+2)
	e.b = append(e.b, `,"output_index":0,"item":`...)
	e.b = x.item(e.b, true)
	e.b = append(e.b, "}\n\n"...)
	if !e.flush() {
		return
	}
	status := x.status()
	e.b = x.event(e.b, "response."+status, seq+3)
	e.b = append(e.b, `,"response":`...)
	e.b = x.response(e.b, status)
	e.b = append(e.b, "}\n\n"...)
	e.flush()
}

// fail follows what OpenAI sends: an error event, then response.failed.
func (x *responses) fail(e *emitter, sent int64) {
	seq := responsesHead + sent
	e.b = x.event(e.b, "error", seq)
	e.b = append(e.b, `,"error":{"type":"server_error","code":"server_error","message":"fake upstream error","param":null}}`+"\n\n"...)
	if !e.flush() {
		return
	}
	e.b = x.event(e.b, "response.failed", seq+1)
	e.b = append(e.b, `,"response":`...)
	e.b = x.response(e.b, "failed")
	e.b = append(e.b, "}\n\n"...)
	e.flush()
}

func (x *responses) whole(b []byte) []byte {
	return append(x.response(b, x.status()), '\n')
}
