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

// relayStream writes and flushes each SSE event as it arrives; no response is buffered whole.
// The usage-only chunk the gateway asked for on the caller's behalf is dropped from what the
// caller sees. stopUpstream ends the upstream call (see finalGrace).
//
// How the stream ends decides the outcome. A clean end, or any end after the stream's final
// event ([DONE], message_stop, response.completed), is a complete answer. A break before it is
// said in the stream — an error event in the stream's format after the last whole event, never
// a half event — or the caller would see a clean end and take the answer for whole.
//
// A call of a named run is tallied before its caller sees the end of its answer, so that a
// settlement sent the moment the answer ends finds the call in the run's tally: from the final
// event on, what the upstream sends is held until it ends (at most finalGrace) and the call is
// tallied. What is held is bounded by limits.max_event_bytes (plus one event): past it the
// upstream is cut.
func (s *Server) relayStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, stopUpstream context.CancelFunc) int {
	headers := time.Now()
	h := w.Header()
	copyResponseHeaders(h, resp.Header)
	h.Del("Content-Length")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	bound := s.boundWrites(rc)
	bound.next()
	w.WriteHeader(resp.StatusCode)
	_ = rc.Flush()
	strip := c.req.route.injectUsage && !c.req.clientAskedUsage
	sc := metering.NewScanner(resp.Body, s.cfg.Limits.MaxEventBytes)
	firstOut := true
	writeEvent := func(raw []byte) bool {
		_, err := bound.write(w, raw)
		ok := err == nil && rc.Flush() == nil
		if ok && firstOut {
			firstOut = false
			s.metrics.firstEventPhase.Observe(time.Since(headers).Seconds())
		}
		return ok
	}
	var (
		sawFinal bool
		// sawError: the provider's own error event ended the answer (see below).
		sawError bool
		sawData  bool   // an event carried data: the upstream answers as a stream
		held     []byte // a named run's final (or error) event and what came after it
		// strippedCR: the usage-only chunk just removed ended in a CR, whose LF, if it
		// comes, leads the next event.
		strippedCR bool
	)
	for {
		// errorEnds: this event is the provider's error event that ended the answer.
		errorEnds := false
		ev, err := nextEvent(sc, c.meter, sawData)
		if err != nil {
			s.endStream(r, c, err, sawFinal || sawError, resp.StatusCode, writeEvent)
			break
		}
		if ev.Data == nil && !sawData && wholeJSON(ev.Raw) {
			// A stream request answered whole, as JSON, under the event-stream label (an
			// upstream that set its label from the request's stream flag, then answered or
			// failed whole): no line of it is a field, so no event carries it. Metered as the
			// body it is, as relayBody meters one under its own label: its usage is charged,
			// its error nothing. Read as a stream, the answer was charged its prompt's
			// estimate with no output, and the error that estimate too.
			c.meter.Body(ev.Raw)
		} else {
			c.meter.Event(ev)
		}
		sawData = sawData || ev.Data != nil
		if !sawFinal && !sawError && c.meter.UpstreamError() {
			// An error event from the upstream ends the answer for the caller (the SDKs raise on
			// it): give back what the call claimed against duplicates before it is sent. As
			// after a final event, the upstream gets finalGrace to close (the Responses API
			// sends response.failed after its error), and a named run's call is tallied before
			// the caller has the event: a settle sent then must find the call ended, not in
			// flight (409 run_busy) until the upstream lets go, up to upstream_timeout.
			sawError, errorEnds = true, true
			s.answerFinal(r.Context(), c)
			defer time.AfterFunc(finalGrace, stopUpstream).Stop()
		}
		if strip && metering.IsUsageOnlyChunk(ev.Data) {
			// Removed whole: a blank line whose CR ended a read was handed on without the LF
			// of its CRLF, which then leads the next event (metering.Scanner), and reached the
			// caller, a byte more than the stream less this chunk, wherever the reads fell.
			strippedCR = bytes.HasSuffix(ev.Raw, []byte{'\r'})
			continue
		}
		raw := ev.Raw
		if strippedCR && len(raw) > 0 && raw[0] == '\n' {
			raw = raw[1:]
		}
		strippedCR = false
		afterFinal := sawFinal // the caller has had the whole answer
		if !sawFinal && metering.IsFinalEvent(c.req.route.format, ev) {
			sawFinal = true
			if !c.inRun {
				// The answer is whole: its tally goes with its fingerprint's release (anything
				// metered after this event is added when the call ends).
				s.tallyWithFingerprint(r.Context(), c, s.settlementAs(c, c.wholeOutcome()))
			}
			s.answerFinal(r.Context(), c)
			s.pinBeforeAnswer(r.Context(), c, c.wholeOutcome(), resp.StatusCode, raw)
			// An upstream that does not close after its final event must not keep the
			// caller waiting for the end of an answer it has whole, nor the call its hold,
			// lease and in-flight slot until upstream_timeout.
			defer time.AfterFunc(finalGrace, stopUpstream).Stop()
		} else if errorEnds {
			// The provider's error event is the answer's end for its caller, as a final event
			// is: an attempt it ends after output pins its Idempotency-Key (a stream_error that
			// produced), and is pinned before the event goes out. Pinned only when the call
			// ended, a gateway killed once its caller had the error left the key free, and the
			// retry ran, and was charged, again. (An event both error and final, Responses'
			// response.failed, is pinned above.)
			s.pinBeforeAnswer(r.Context(), c, c.wholeOutcome(), resp.StatusCode, raw)
		}
		if c.inRun && (sawFinal || sawError) {
			held = append(held, raw...) // the scanner reuses its memory
			if len(held) > s.cfg.Limits.MaxEventBytes {
				// An upstream that goes on after its final event is cut: what it sends
				// then is not the answer, and held must not grow with it (nor with what
				// was read before the cut took effect).
				stopUpstream()
				c.outcome = outcomeComplete
				break
			}
			continue
		}
		if !writeEvent(raw) {
			c.outcome = outcomeCancel
			if afterFinal || c.idemPinned {
				// The answer is whole, and for an idempotent attempt pinned: its caller's
				// retry is answered from it (or, were the record lost, told so from this
				// complete settlement), never run again.
				c.outcome = outcomeComplete
			}
			break
		}
	}
	if (c.outcome == outcomeComplete || c.outcome == outcomeCancel) && c.meter.Result().UpstreamError {
		// The provider ended the answer with an error, which the SDKs raise on and close the
		// stream at once: a caller leaving after it, before the upstream's own end reached the
		// gateway, is no cancel. Settled as one, a failure with no output and no usage was
		// charged its prompt's estimate, or nothing when the upstream happened to close first.
		c.outcome = outcomeStreamError
	}
	if c.inRun && (sawFinal || sawError) {
		// (held is empty when the event that ended the answer was the usage-only chunk the
		// caller did not ask for, named error: the call is tallied before the end all the same.)
		s.tallyBeforeAnswer(r.Context(), c)
		if held != nil {
			_ = writeEvent(held)
		}
	}
	return resp.StatusCode
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
func nextEvent(sc *metering.Scanner, m *metering.Meter, sawData bool) (metering.Event, error) {
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
	return ev, nil
}

// errStreamCut ends a stream that ended cleanly inside an event whose JSON is cut (relayStream).
var errStreamCut = errors.New("upstream stream ended inside an event: its JSON is cut short")

// endStream sets how a stream that stopped with err (io.EOF: a clean end) ended and, when it
// broke before its final event, says so in the stream (writeEvent): the caller must not read a
// clean end of a cut answer. status is the upstream's, which a pinned Idempotency-Key keeps.
func (s *Server) endStream(r *http.Request, c *call, err error, sawFinal bool, status int, writeEvent func([]byte) bool) {
	switch {
	case errors.Is(err, io.EOF), sawFinal:
		c.outcome = outcomeComplete
	case clientGone(r):
		c.outcome = outcomeCancel
		if !errors.Is(context.Cause(r.Context()), errSuperseded) {
			// Said in the stream, as any break is: a caller that only half-closed still reads,
			// and saw a clean end of a cut answer (see answerClientClosed). A superseded call
			// is told by answerSuperseded.
			_ = writeEvent(streamErrorEvent(c.req.route.format, errClientClosed))
		}
	default:
		c.outcome = outcomeStreamError
		c.log.Warn("upstream stream broke", zap.Error(err))
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
		last := streamErrorEvent(c.req.route.format, e)
		s.pinBeforeAnswer(r.Context(), c, c.outcome, status, last)
		_ = writeEvent(last)
	}
}

// finalGrace is how long a call waits, after its stream's final event, for the upstream to
// close; then the upstream is cut (a named run's call is then tallied and its final event sent).
const finalGrace = 2 * time.Second

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
