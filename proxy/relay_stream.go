package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/metering"
	"go.uber.org/zap"
)

// relayStream writes each SSE event as it arrives, and flushes what it wrote before it waits
// for the upstream again (metering.Scanner.BeforeRead) or on Redis and MySQL at the answer's
// end (its tally, its pin): no event is held while anything is waited for, and events that
// arrived together go out in one write, not one each
// (on a busy box a stream's events bunch in the upstream's reads, and a write per event was a
// quarter of the gateway's CPU). No response is buffered whole.
// The usage-only chunk the gateway asked for on the caller's behalf is dropped from what the
// caller sees. stopUpstream ends the upstream call (see finalGrace).
//
// How the stream ends decides the outcome. Any end after the stream's final event ([DONE],
// message_stop, response.completed) is a complete answer, and so is a clean end of a chat or
// completions stream without [DONE] (providers end so; Anthropic's and the Responses API's
// streams end with their final event, and without it are cut: errStreamUnfinished). A break
// before it is said in the stream — an error event in the stream's format after the last whole
// event, never a half event — or the caller would see a clean end and take the answer for whole.
//
// A call of a named run is tallied before its caller sees the end of its answer, so that a
// settlement sent the moment the answer ends finds the call in the run's tally: from the final
// event on, what the upstream sends is held until it ends (at most finalGrace) and the call is
// tallied. What is held is bounded by limits.max_event_bytes (plus one event): past it the
// upstream is cut.
func (s *Server) relayStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, stopUpstream context.CancelFunc) int {
	sr := s.startStream(w, r, resp, c, stopUpstream)
	defer sr.stopGrace()
	sc := metering.NewScanner(resp.Body, s.cfg.Limits.MaxEventBytes)
	sc.BeforeRead(sr.flush)
	for {
		ev, err := nextEvent(sc, c.meter, sr.sawData, sr.sawAny)
		if err != nil {
			// What came with the upstream's end goes out before endStream waits on Redis and
			// MySQL (answerFinal, a run's tally, a pin), and a caller gone meanwhile is seen.
			sr.flush()
		}
		if sr.gone {
			// A flush failed: the caller stopped taking the answer. Nothing read after it is
			// acted on (no pin, no tally as whole), as nothing was read after a failed write.
			sr.left()
			break
		}
		if err != nil {
			switch {
			case !errors.Is(err, io.EOF):
			case !sr.sawAny:
				err = errStreamEmpty
			case !sr.ended() && metering.FinalEventRequired(c.req.route.format):
				err = errStreamUnfinished
			}
			s.endStream(r, c, err, sr.sawFinal || sr.sawError, sr.unended, resp.StatusCode, sr.write)
			break
		}
		// Keep-alive comments alone (a router's ": PROCESSING" while it waits for its
		// provider) are no answer: a stream that ends after them ends as one that ends
		// before its first event (errStreamEmpty), not as a complete empty answer.
		sr.sawAny = sr.sawAny || !commentsOnly(ev.Raw)
		sr.meter(ev)
		if !sr.ended() && (c.meter.UpstreamError() || metering.IsFinalEvent(c.req.route.format, ev)) {
			// The answer's end: its tallies and pins wait on Redis and MySQL; what was
			// written before it goes out first.
			sr.flush()
			if sr.gone {
				sr.left()
				break
			}
		}
		errorEnds := sr.upstreamErrorEnds()
		if errorEnds {
			logErrorEvent(c, ev)
		}
		raw, relayed := sr.strip.pass(ev)
		if !relayed {
			continue
		}
		// The operator's key is looked for in every event relayed (read in place, copied only
		// where it is quoted): a proxy or router on the way may quote it in what is no error
		// event (a page or a line of text under the stream's label, a comment), and was relayed
		// as it sent it.
		raw = redactKey(raw, c.req.upstream.APIKey)
		if sr.sawError {
			// The provider's error event may word its account's ids, as its error answers may
			// (redactAccountIDs); so may what follows it (the Responses API's response.failed
			// repeats the error's words).
			raw = redactAccountIDs(raw, resp.Header)
		}
		if !sr.sawFinal && metering.IsFinalEvent(c.req.route.format, ev) {
			sr.finalEvent(raw)
		} else if errorEnds {
			// The provider's error event is the answer's end for its caller, as a final event
			// is: an attempt it ends after output pins its Idempotency-Key (a stream_error that
			// produced), and is pinned before the event goes out. Pinned only when the call
			// ended, a gateway killed once its caller had the error left the key free, and the
			// retry ran, and was charged, again. (An event both error and final, Responses'
			// response.failed, is pinned above.)
			s.pinBeforeAnswer(r.Context(), c, c.wholeOutcome(), sr.status, raw)
			sr.pinnedAtError, sr.finalAdjacent = true, true
		} else {
			sr.finalAdjacent = false
		}
		if c.inRun && sr.ended() {
			if !sr.hold(raw) {
				break
			}
			continue
		}
		if !sr.write(raw) {
			sr.left()
			break
		}
		sr.unended = ev.Unterminated
	}
	sr.flush() // finish may wait on a named run's tally
	sr.finish()
	sr.flush()
	return resp.StatusCode
}

// streamRelay is one stream on its way through relayStream: where the caller's side stands
// and what has been seen of the upstream's.
type streamRelay struct {
	s            *Server
	w            http.ResponseWriter
	r            *http.Request
	c            *call
	rc           *http.ResponseController
	bound        *writeBound
	stopUpstream context.CancelFunc
	status       int // the upstream's, which the caller was sent
	// grace cuts the upstream finalGrace after the answer's end (a final or an error event).
	grace   *time.Timer
	headers time.Time // the upstream's headers came: the first event's phase starts here
	// unflushed: written since the last flush; sent: a flush has carried an event to the
	// caller; wroteFinal: what was written includes the answer's end (its final event);
	// finalSent: a flush carried it; gone: a flush failed, the caller stopped taking the answer.
	unflushed, sent, wroteFinal, finalSent, gone bool
	// strip: the usage-only chunk was asked for on the caller's behalf, and is not relayed.
	strip    usageChunkStrip
	sawFinal bool   // the stream's final event ([DONE], message_stop, response.completed)
	unended  bool   // the last event written was the stream's end inside it, without its blank line
	sawError bool   // the provider's own error event ended the answer
	sawData  bool   // an event carried data: the upstream answers as a stream
	sawAny   bool   // the upstream sent anything but keep-alive comments: an event, or a whole answer under the label
	held     []byte // a named run's final (or error) event and what came after it
	// pinnedAtError: an Idempotency-Key's record was closed at the provider's error event; a
	// final event joins it only while finalAdjacent (nothing relayed since), or the record
	// would skip what its caller got between the two.
	pinnedAtError, finalAdjacent bool
}

// startStream sends the caller the upstream's status and headers, flushed at once.
func (s *Server) startStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, stopUpstream context.CancelFunc) *streamRelay {
	sr := &streamRelay{s: s, w: w, r: r, c: c, stopUpstream: stopUpstream, status: resp.StatusCode, headers: time.Now(),
		strip: usageChunkStrip{on: c.req.route.injectUsage && !c.req.clientAskedUsage}}
	h := w.Header()
	copyAnswerHeaders(h, resp.Header)
	h.Del("Content-Length")
	h.Set("X-Accel-Buffering", "no")
	sr.rc = http.NewResponseController(w)
	sr.bound = s.boundWrites(sr.rc)
	sr.bound.next()
	w.WriteHeader(resp.StatusCode)
	_ = sr.rc.Flush()
	return sr
}

// write writes raw for the caller, to go out with the next flush; false: the caller is gone
// (or stopped reading).
func (sr *streamRelay) write(raw []byte) bool {
	if sr.gone {
		return false
	}
	if _, err := sr.bound.write(sr.w, raw); err != nil {
		return false
	}
	sr.unflushed = true
	sr.wroteFinal = sr.wroteFinal || sr.sawFinal
	return true
}

// flush sends the caller what was written since the last flush. A flush that fails means the
// caller is gone or stopped reading: the upstream is stopped, so that the read the flush came
// before ends at once instead of when the upstream next sends (net/http cancels the request's
// context too when a write to its connection fails; this does not lean on it), and
// relayStream ends the call (left).
func (sr *streamRelay) flush() {
	if !sr.unflushed || sr.gone {
		return
	}
	sr.unflushed = false
	sr.bound.next()
	if sr.rc.Flush() != nil {
		sr.gone = true
		sr.stopUpstream()
		return
	}
	sr.finalSent = sr.wroteFinal
	if !sr.sent {
		sr.sent = true
		sr.s.metrics.firstEventPhase.Observe(time.Since(sr.headers).Seconds())
	}
}

// left ends a call whose caller stopped taking its answer: cancelled, unless a flush had
// carried the answer's end to it, or the idempotent attempt is pinned — then the answer is
// whole, and the caller's retry is answered from it (or, were the record lost, told so from
// this complete settlement), never run again.
func (sr *streamRelay) left() {
	sr.c.outcome = outcomeCancel
	if sr.finalSent || sr.c.idemPinned {
		sr.c.outcome = outcomeComplete
	}
}

// meter reads ev's usage.
func (sr *streamRelay) meter(ev metering.Event) {
	if ev.Data == nil && !sr.sawData && wholeJSON(ev.Raw) {
		// A stream request answered whole, as JSON, under the event-stream label (an
		// upstream that set its label from the request's stream flag, then answered or
		// failed whole): no line of it is a field, so no event carries it. Metered as the
		// body it is, as relayBody meters one under its own label: its usage is charged,
		// its error nothing. Read as a stream, the answer was charged its prompt's
		// estimate with no output, and the error that estimate too.
		sr.c.meter.Body(ev.Raw)
	} else {
		sr.c.meter.Event(ev)
	}
	sr.sawData = sr.sawData || ev.Data != nil
}

// upstreamErrorEnds reports whether the event just metered is the provider's own error event
// that ends the answer (its first, before any final event). That ends the answer for the
// caller (the SDKs raise on it): what the call claimed against duplicates is given back before
// it is sent. As after a final event, the upstream gets finalGrace to close (the Responses API
// sends response.failed after its error), and a named run's call is tallied before the caller
// has the event: a settle sent then must find the call ended, not in flight (409 run_busy)
// until the upstream lets go, up to upstream_timeout.
func (sr *streamRelay) upstreamErrorEnds() bool {
	if sr.sawFinal || sr.sawError || !sr.c.meter.UpstreamError() {
		return false
	}
	sr.sawError = true
	sr.s.answerFinal(sr.r.Context(), sr.c)
	sr.startGrace()
	return true
}

// usageChunkStrip removes the usage-only chunk (metering.IsUsageOnlyChunk) asked for on a
// caller's behalf from the events it is handed, in order, and keeps every other byte as it came.
type usageChunkStrip struct {
	on bool
	// strippedCR: the chunk just removed ended in a CR, whose LF, if it comes, leads the next
	// event.
	strippedCR bool
}

// pass is what of ev the caller gets; false: nothing (the usage-only chunk it did not ask for).
func (u *usageChunkStrip) pass(ev metering.Event) ([]byte, bool) {
	if u.on && metering.IsUsageOnlyChunk(ev.Data) {
		// Removed whole: a blank line whose CR ended a read was handed on without the LF
		// of its CRLF, which then leads the next event (metering.Scanner), and reached the
		// caller, a byte more than the stream less this chunk, wherever the reads fell.
		u.strippedCR = bytes.HasSuffix(ev.Raw, []byte{'\r'})
		return nil, false
	}
	raw := ev.Raw
	if u.strippedCR && len(raw) > 0 && raw[0] == '\n' {
		raw = raw[1:]
	}
	u.strippedCR = false
	return raw, true
}

// finalEvent ends the answer at its final event, raw, before it goes out: a plain call's tally
// rides with its fingerprint's release, what it claimed against duplicates is given back, an
// Idempotency-Key's answer is pinned, and the upstream gets finalGrace to close.
func (sr *streamRelay) finalEvent(raw []byte) {
	s, c, ctx := sr.s, sr.c, sr.r.Context()
	sr.sawFinal = true
	if !c.inRun {
		// The answer is whole: its tally goes with its fingerprint's release (anything
		// metered after this event is added when the call ends).
		s.tallyWithFingerprint(ctx, c, s.settlementAs(c, c.wholeOutcome()))
	}
	s.beforeStep(ctx, stepFinalEvent)
	s.answerFinal(ctx, c)
	if !sr.pinnedAtError || sr.finalAdjacent {
		s.pinBeforeAnswer(ctx, c, c.wholeOutcome(), sr.status, raw)
	}
	// An upstream that does not close after its final event must not keep the caller
	// waiting for the end of an answer it has whole, nor the call its hold, lease and
	// in-flight slot until upstream_timeout.
	sr.startGrace()
}

// ended reports whether the answer has ended for its caller (a final or an error event).
func (sr *streamRelay) ended() bool { return sr.sawFinal || sr.sawError }

// hold keeps raw, of a named run's answer after its end, for the caller until the call is
// tallied (finish). False: past limits.max_event_bytes, and the upstream is cut — what it
// sends then is not the answer, and held must not grow with it (nor with what was read before
// the cut took effect).
func (sr *streamRelay) hold(raw []byte) bool {
	sr.held = append(sr.held, raw...) // the scanner reuses its memory
	if len(sr.held) > sr.s.cfg.Limits.MaxEventBytes {
		sr.stopUpstream()
		sr.c.outcome = outcomeComplete
		return false
	}
	return true
}

// finish sets the outcome of an answer the provider ended with an error and, for a named
// run's call that ended, tallies it before the caller gets what was held.
func (sr *streamRelay) finish() {
	c := sr.c
	if (c.outcome == outcomeComplete || c.outcome == outcomeCancel) && c.meter.Result().UpstreamError {
		// The provider ended the answer with an error, which the SDKs raise on and close the
		// stream at once: a caller leaving after it, before the upstream's own end reached the
		// gateway, is no cancel. Settled as one, a failure with no output and no usage was
		// charged its prompt's estimate, or nothing when the upstream happened to close first.
		c.outcome = outcomeStreamError
	}
	if c.inRun && sr.ended() {
		// (held is empty when the event that ended the answer was the usage-only chunk the
		// caller did not ask for, named error: the call is tallied before the end all the same.)
		sr.s.tallyBeforeAnswer(sr.r.Context(), c)
		if sr.held != nil {
			_ = sr.write(sr.held)
		}
	}
}

// finalGrace is how long a call waits, after its stream's final event, for the upstream to
// close; then the upstream is cut (a named run's call is then tallied and its final event sent).
const finalGrace = 2 * time.Second

// startGrace starts finalGrace at the answer's first end; a later end (an error event, then
// the final one) does not move it.
func (sr *streamRelay) startGrace() {
	if sr.grace == nil {
		sr.grace = time.AfterFunc(finalGrace, sr.stopUpstream)
	}
}

func (sr *streamRelay) stopGrace() {
	if sr.grace != nil {
		sr.grace.Stop()
	}
}

// nextEvent reads the stream's next event. An event the stream ended inside is passed on only
// when the stream ended cleanly; after a break, a half event followed by the error event would
// read as one garbled event, so the break is returned instead (the half event metered only if
// its JSON is whole: a usage object cut mid-number would be read as reported, with the wrong
// count). sawData says whether an earlier event carried data (the upstream answers as a
// stream, not as a JSON body under the event-stream label).
//
// An end that looks clean may be a cut too: a body delimited by the connection's close ends
// with io.EOF however the upstream went away. An event whose JSON is cut is such a cut, and
// said as the break it is (errStreamCut): relayed, the caller had half an event and a clean end
// (an SDK that drops an unfinished event at the end took the answer for whole), and the call
// ended complete. Not metered, for the same reason.
//
// sawAny says whether an earlier event was more than keep-alive comments. A stream of nothing
// else that ends inside one ends empty (errStreamEmpty), and the half comment is not passed on,
// as a half event after a break is not: relayed, the gateway's error event was written on its
// unended line, and read as part of the comment, so the caller saw no event and a clean end.
func nextEvent(sc *metering.Scanner, m *metering.Meter, sawData, sawAny bool) (metering.Event, error) {
	ev, err := sc.Next()
	if err != nil || !ev.Unterminated {
		return ev, err
	}
	if _, end := sc.Next(); !errors.Is(end, io.EOF) {
		if json.Valid(bytes.TrimSpace(ev.Data)) {
			m.Event(ev)
		}
		return ev, end
	}
	if cutJSON(ev.Data) || (ev.Data == nil && !sawData && cutJSON(ev.Raw)) {
		return ev, errStreamCut
	}
	if !sawAny && commentsOnly(ev.Raw) {
		return ev, errStreamEmpty
	}
	return ev, nil
}

// commentsOnly reports whether raw, an event as received, holds nothing but comment lines and
// blank ones (a byte order mark aside): keep-alives, no part of an answer.
func commentsOnly(raw []byte) bool {
	raw = bytes.TrimPrefix(raw, []byte("\xEF\xBB\xBF"))
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexAny(raw, "\r\n"); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) > 0 && line[0] != ':' {
			return false
		}
	}
	return true
}

// errStreamEmpty ends a stream that ended cleanly before the upstream sent anything: no answer
// (an SDK reads it as an empty one, and it pinned an Idempotency-Key to nothing for a day), and
// perhaps one cut before its first event: broken, as one cut later is.
var errStreamEmpty = errors.New("upstream stream ended before any event carried data")

// errStreamCut ends a stream that ended cleanly inside an event whose JSON is cut (relayStream).
var errStreamCut = errors.New("upstream stream ended inside an event: its JSON is cut short")

// errStreamUnfinished ends a stream that ended cleanly between two events before its final one,
// in a format whose providers always send it (metering.FinalEventRequired): a body delimited by
// the connection's close reads a dropped connection so, and so does a proxy's chunked answer
// that it ended when its upstream went away. Read as a clean end, the caller saw a cut answer
// end cleanly, and an Idempotency-Key was pinned to it: every retry replayed the cut answer.
var errStreamUnfinished = errors.New("upstream stream ended cleanly before its final event")

// endStream sets how a stream that stopped with err (io.EOF: a clean end) ended and, when it
// broke before its final event, says so in the stream (writeEvent): the caller must not read a
// clean end of a cut answer. status is the upstream's, which a pinned Idempotency-Key keeps.
// unended says the last event written was one the stream ended inside, passed on whole without
// its blank line: the error event first ends it, or the caller's parser read the error event's
// lines as more of that event (errStreamUnfinished after it).
func (s *Server) endStream(r *http.Request, c *call, err error, sawFinal, unended bool, status int, writeEvent func([]byte) bool) {
	errorEvent := func(e *apiError) []byte {
		ev := streamErrorEvent(c.req.route.format, e)
		if unended {
			ev = append([]byte("\n\n"), ev...)
		}
		return ev
	}
	switch {
	case errors.Is(err, io.EOF), sawFinal:
		c.outcome = outcomeComplete
	case requestEnded(r):
		c.outcome = outcomeCancel
		if !errors.Is(context.Cause(r.Context()), errSuperseded) {
			// Said in the stream, as any break is: a caller that only half-closed still reads,
			// and saw a clean end of a cut answer (see answerClientClosed). A superseded call
			// is told by answerSuperseded.
			e, _ := endedCall(r, c, "")
			_ = writeEvent(errorEvent(e))
		}
	default:
		c.outcome = outcomeStreamError
		c.log.Warn("upstream stream broke", zap.Error(loggedUpstreamErr(c.req.upstream, err)))
		e := &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream stream broke before the answer was complete."}
		if isTimeout(err) {
			e = &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
				Message: "The upstream did not finish the answer in time."}
		}
		// The error event is the last the caller gets: what the call claimed against duplicates
		// is given back, an answer that pins its Idempotency-Key is recorded, and a call of a
		// named run is tallied (its reservation given back), before it is sent, as for a clean
		// end: a settle sent the moment the caller has the event must charge the call, not
		// find it still in flight (409 run_busy).
		s.answerFinal(r.Context(), c)
		if c.inRun {
			s.tallyBeforeAnswer(r.Context(), c)
		}
		last := errorEvent(e)
		s.pinBeforeAnswer(r.Context(), c, c.outcome, status, last)
		_ = writeEvent(last)
	}
}

// streamErrorEvent is e as an SSE event in the stream's own format, for errors that happen
// once the stream's 200 has been sent.
func streamErrorEvent(f metering.Format, e *apiError) []byte {
	var b []byte
	switch f {
	case metering.FormatAnthropic:
		b, _ = json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": anthropicErrorType(e.Status),
			"message": e.Message, "code": e.Code}})
		return append(append([]byte("event: error\ndata: "), b...), '\n', '\n')
	case metering.FormatResponses:
		// The documented event has code and message at the top; what OpenAI sends (and what
		// the OpenAI SDKs end a stream with an error on) nests them under "error"
		// (testdata/usage/openai_responses_stream_error_then_failed.sse). Both, so that
		// neither kind of client reads a broken stream as a clean end.
		b, _ = json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": nil,
			"error": map[string]any{"type": e.Type, "code": e.Code, "message": e.Message, "param": nil}})
		return append(append([]byte("event: error\ndata: "), b...), '\n', '\n')
	default:
		b, _ = json.Marshal(map[string]any{"error": map[string]string{"message": e.Message, "type": e.Type, "code": e.Code}})
		return append(append([]byte("data: "), b...), '\n', '\n')
	}
}
