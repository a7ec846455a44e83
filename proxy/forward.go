package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
)

// forward sends the call upstream and copies the answer back, feeding every byte to the
// meter on the way. It returns the status the client saw and sets c.outcome.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, c *call) int {
	// The upstream call is bound to the client's request: a client that leaves stops the
	// generation, and with it the cost.
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.UpstreamTimeout)
	defer cancel()
	// Whether the provider has the whole request decides what a timeout costs (below).
	// (A connection the transport retries on starts unsent again.)
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { sent.Store(false) },
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	})
	ctx, headersLate := headerWait(ctx, c.req.stream, s.cfg.Limits.HeaderTimeout)
	up, err := s.upstreamRequest(ctx, r, c.req.upstream, c.req.route.path, c.req.body)
	if err != nil {
		headersLate()
		c.outcome = outcomeRefused
		c.log.Error("build upstream request", zap.Error(err))
		writeError(w, errBuildUpstream)
		return http.StatusInternalServerError
	}
	sending := time.Now()
	s.metrics.checksPhase.Observe(sending.Sub(c.held).Seconds())
	resp, err := s.client.Do(up)
	if headersLate() {
		// Said as the timeout it is (Do says "context canceled"). Headers that came just as
		// the wait ran out cannot be relayed: the answer would be read under a cancelled context.
		if err == nil {
			resp.Body.Close()
		}
		err = fmt.Errorf("upstream %s: %w", c.req.upstream.Name, errHeaderTimeout)
	}
	if err == nil {
		s.metrics.upstreamPhase.Observe(time.Since(sending).Seconds())
	}
	if err != nil {
		if clientGone(r) {
			// If the provider has the prompt, charge the estimate of it; if the request never
			// reached it whole, nothing was used.
			c.outcome = outcomeCancel
			if !sent.Load() {
				c.outcome = outcomeRefused
			}
			return answerClientClosed(w, r)
		}
		if headersTooLarge(err) && sent.Load() {
			// The provider had the prompt and answered, with headers past the bound: as an
			// answer in an encoding not asked for, it cannot be relayed and is charged its
			// estimate, and a retry would be answered the same way.
			c.outcome = outcomeStreamError
			c.log.Warn("upstream answered with headers over the bound", zap.String("upstream", c.req.upstream.Name),
				zap.Int("limit", maxUpstreamHeaderBytes), zap.Error(err))
			writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
				Message: fmt.Sprintf("The upstream answered with more than %d bytes of headers.", maxUpstreamHeaderBytes), NoRetry: true})
			return http.StatusBadGateway
		}
		c.outcome = outcomeUpstreamError
		e := &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_unreachable",
			Message: "The upstream could not be reached."}
		if isTimeout(err) {
			e = &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
				Message: "The upstream did not answer in time."}
			if sent.Load() {
				// The provider took the prompt and was still working on it when the gateway
				// gave up, as when a client leaves: charge the estimate of the prompt.
				c.outcome = outcomeUpstreamTimeout
			}
		}
		c.log.Warn("upstream request failed", zap.String("upstream", c.req.upstream.Name), zap.Error(err))
		writeError(w, e)
		return e.Status
	}
	defer resp.Body.Close()
	// The provider's id of the call goes with every answer to it, the gateway's own errors
	// included, and with every later log line of the call.
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamTraceHeaders)
	if f, ok := upstreamRequestID(resp); ok {
		c.log = c.log.With(f)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		c.outcome = outcomeUpstreamError
		return s.relayUpstreamError(w, resp, c.req.upstream.Name, c.log)
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		// The transport asks for gzip and decodes it; any other encoding was not asked for and
		// cannot be metered. Nothing is served that cannot be charged: the provider had the
		// prompt, so the call is charged its estimate, as a stream that broke.
		c.outcome = outcomeStreamError
		c.log.Warn("upstream answered in an encoding it was not asked for", zap.String("content_encoding", ce[:min(len(ce), 64)]))
		// Not to be retried: the provider answers a retry the same way, charged again.
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream answered in an encoding the gateway did not ask for.", NoRetry: true})
		return http.StatusBadGateway
	}
	// A call that did not ask for a stream is answered whole, whatever its label says: a JSON
	// body under text/event-stream would read as no event at all and go unmetered (relayBody
	// meters a stream that came unasked as a stream).
	if c.req.stream && isEventStream(resp.Header.Get("Content-Type")) {
		return s.relayStream(w, r, resp, c, cancel)
	}
	return s.relayBody(w, r, resp, c)
}

// errHeaderTimeout ends a streamed call whose upstream sent no headers within
// limits.header_timeout (headerWait).
var errHeaderTimeout = timeoutError("upstream sent no response headers within header_timeout")

// timeoutError is an error that reports itself a timeout (isTimeout).
type timeoutError string

func (e timeoutError) Error() string { return string(e) }
func (e timeoutError) Timeout() bool { return true }

// headerWait bounds the wait for a streamed call's response headers by timeout
// (limits.header_timeout): a stream's headers come before its first token, and an upstream
// that sends none for that long is stuck. A call answered whole gets its headers only with its
// whole answer, which a reasoning model or a long output may rightly take minutes to write:
// limits.upstream_timeout alone bounds it. (Cut at header_timeout, such a call was answered
// 504, charged its prompt's estimate, and retried by the SDKs, each retry cut and charged
// again: the caller paid three times for no answer.)
//
// stop is called once the headers came or the request failed: it stops the wait and reports
// whether it had run out, cancelling ctx (Do's error then says "context canceled", not why).
func headerWait(ctx context.Context, stream bool, timeout time.Duration) (_ context.Context, stop func() (late bool)) {
	return headerWaitOn(ctx, stream, timeout, func(d time.Duration, f func()) interface{ Stop() bool } {
		return time.AfterFunc(d, f)
	})
}

// headerWaitOn is headerWait on the timer afterFunc starts (time.AfterFunc; a test's own).
//
// A timer that fired has run out the wait even if its function has not cancelled ctx yet
// (it runs in a goroutine of its own): stop then cancels ctx itself and reports it late.
// Reported in time, the answer would be relayed under a ctx cancelled a moment later, and
// break after its headers.
func headerWaitOn(ctx context.Context, stream bool, timeout time.Duration,
	afterFunc func(time.Duration, func()) interface{ Stop() bool }) (_ context.Context, stop func() (late bool)) {
	if !stream || timeout <= 0 {
		return ctx, func() bool { return false }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	t := afterFunc(timeout, func() { cancel(errHeaderTimeout) })
	return ctx, func() bool {
		if t.Stop() {
			return false
		}
		cancel(errHeaderTimeout) // no-op if the timer's function (or the parent) was first
		return errors.Is(context.Cause(ctx), errHeaderTimeout)
	}
}

// isEventStream reports whether a Content-Type is text/event-stream, in any case and with any
// parameters: media types are case-insensitive (RFC 9110 §8.3.1), and a stream taken for a
// body would be buffered whole and reach its caller only when it ends.
func isEventStream(ctype string) bool {
	mt, _, _ := strings.Cut(ctype, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

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
		ev, err := sc.Next()
		if err == nil && ev.Unterminated {
			// The stream ended inside this event: forwarded if it ended cleanly; after a
			// break, a half event followed by the error event would read as one garbled event.
			if _, end := sc.Next(); !errors.Is(end, io.EOF) {
				// Metered only if whole JSON: a usage object cut mid-number would be read as
				// reported, with the wrong count.
				if json.Valid(bytes.TrimSpace(ev.Data)) {
					c.meter.Event(ev)
				}
				err = end
			} else if cutJSON(ev.Data) || (ev.Data == nil && !sawData && cutJSON(ev.Raw)) {
				// An end that looks clean may be a cut too: a body delimited by the
				// connection's close ends with io.EOF however the upstream went away. An event
				// whose JSON is cut is such a cut, and said as the break it is: relayed, the
				// caller had half an event and a clean end (an SDK that drops an unfinished
				// event at the end took the answer for whole), and the call ended complete.
				// Not metered: a usage cut mid-number would be read as reported.
				err = errStreamCut
			}
		}
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
			sawError = true
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

// relayBody copies a non-streamed answer, bounded by max_response_bytes.
func (s *Server) relayBody(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) int {
	limit := s.cfg.Limits.MaxResponseBytes
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if clientGone(r) {
			c.outcome = outcomeCancel
			return answerClientClosed(w, r)
		}
		if isTimeout(err) {
			// The provider has the prompt and was still answering when the gateway gave up: as
			// for a timeout before its headers, charge the prompt's estimate and say so.
			c.outcome = outcomeUpstreamTimeout
			c.log.Warn("upstream body timed out", zap.Error(err))
			writeError(w, &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
				Message: "The upstream did not finish the answer in time."})
			return http.StatusGatewayTimeout
		}
		c.outcome = outcomeStreamError
		c.log.Warn("upstream body broke", zap.Error(err))
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream connection broke before the answer was complete."})
		return http.StatusBadGateway
	}
	if int64(len(body)) > limit {
		c.outcome = outcomeStreamError
		most := int64(math.MaxInt64)
		if limit <= math.MaxInt64/oversizeReadFactor {
			most = oversizeReadFactor * limit
		}
		// Read before the error goes out: a caller that has its answer leaves, and the
		// upstream read, bound to its context, would end before the report.
		read := meterOversized(c.meter, body, resp.Body, most)
		c.log.Warn("upstream body over the limit", zap.Int64("limit", limit), zap.Int64("read", read),
			zap.Bool("usage_found", c.meter.Result().Reported))
		// Charged the whole answer it cannot pass on: an SDK's automatic retry of a 502 (twice,
		// by default) would be answered as large again, and charged again, for nothing.
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_response_too_large",
			Message: fmt.Sprintf("The upstream answer is larger than %d bytes.", limit), NoRetry: true})
		return http.StatusBadGateway
	}
	if cutJSON(body) {
		// A JSON answer that is not whole came from an upstream that went away mid-answer
		// while its body was delimited by the connection's close (which reads as a clean
		// end): as when it breaks a Content-Length. Metered, a usage object cut mid-number
		// was charged as the provider's word ("completion_tokens":4 of 400).
		c.outcome = outcomeStreamError
		c.log.Warn("upstream body cut short", zap.Int("bytes", len(body)))
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: "The upstream connection broke before the answer was complete."})
		return http.StatusBadGateway
	}
	// A web page — a captive portal, a proxy's or CDN's page, a base_url that names a website —
	// or other text that is neither JSON nor events (a maintenance page that opens with no
	// tag, a proxy's "upstream connect error") is no model's answer: the provider never had
	// the prompt, and the SDKs cannot read it. Relayed, it was charged the prompt's estimate on
	// every call for as long as it stood there.
	if webPage(body) {
		return refuseNonAnswer(w, c, resp, body, "upstream answered with a web page",
			"The upstream answered with a web page, not an API answer: is its base_url right?")
	}
	if noAnswer(body, s.cfg.Limits.MaxEventBytes) {
		return refuseNonAnswer(w, c, resp, body, "upstream answered with text that is no API answer",
			"The upstream answered with text that is not an API answer.")
	}
	meterBody(c.meter, body, s.cfg.Limits.MaxEventBytes)
	if !c.meter.Result().Reported {
		logErrorObject(c, body)
	}
	c.outcome = c.wholeOutcome()
	if c.inRun {
		s.tallyBeforeAnswer(r.Context(), c)
	} else {
		s.tallyWithFingerprint(r.Context(), c, s.settlementOf(c))
	}
	s.answerFinal(r.Context(), c)
	// The upstream's headers go out only with its answer: an error answer above must not
	// carry its Content-Length (the caller would read a truncated body) or its encoding.
	copyResponseHeaders(w.Header(), resp.Header)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	s.pinBeforeAnswer(r.Context(), c, c.outcome, resp.StatusCode, body)
	rc := http.NewResponseController(w)
	bound := s.boundWrites(rc)
	bound.next()
	w.WriteHeader(resp.StatusCode)
	if _, err := bound.write(w, body); err != nil && c.outcome == outcomeComplete && !c.idemPinned {
		// Only a complete answer becomes a cancel: an upstream error stays one (what it is
		// charged, possibly nothing, was tallied above, before the answer went out); a
		// pinned one stays complete, as its record says (see relayStream).
		c.outcome = outcomeCancel
	}
	// Flush now: the handler still has its deferred settlement to hand off, and the caller
	// need not wait for that.
	_ = rc.Flush()
	return resp.StatusCode
}

// meterBody meters a whole answer: a JSON body, or else an event stream that came under
// another content type (an upstream that left its Content-Type to sniffing gets text/plain).
// Either way what it reported, or the text it produced, is what the call is charged.
func meterBody(m *metering.Meter, body []byte, maxEvent int) {
	if t := metering.TrimBody(body); len(t) == 0 || t[0] == '{' {
		m.Body(body)
		return
	}
	sc := metering.NewScanner(bytes.NewReader(body), maxEvent)
	for {
		ev, err := sc.Next()
		if err != nil {
			return
		}
		if ev.Unterminated && cutJSON(ev.Data) {
			return // the body ended inside this event: a cut usage is no report (see relayStream)
		}
		m.Event(ev)
	}
}

// logErrorObject writes a WARN line for a successful answer whose body is an error object
// (some OpenAI-compatible servers answer a failure with a 200): it is relayed as sent and,
// without a usage report, charged nothing, and the log is where an operator sees that an
// upstream fails every call. Looked for only in answers without a usage report.
func logErrorObject(c *call, body []byte) {
	e := gjson.GetBytes(body, "error")
	if !e.IsObject() {
		return
	}
	msg := e.Get("message").String()
	c.log.Warn("upstream answered 200 with an error object", zap.String("upstream", c.req.upstream.Name),
		zap.String("error_type", e.Get("type").String()), zap.String("error_message", msg[:min(len(msg), 512)]))
}

// refuseNonAnswer answers a 200 that holds no model's answer 502 upstream_error, charged
// nothing, and logs its start.
func refuseNonAnswer(w http.ResponseWriter, c *call, resp *http.Response, body []byte, logMsg, message string) int {
	c.outcome = outcomeUpstreamError
	c.log.Warn(logMsg, zap.String("upstream", c.req.upstream.Name),
		zap.String("content_type", resp.Header.Get("Content-Type")), zap.ByteString("head", body[:min(len(body), 256)]))
	writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_error", Message: message})
	return http.StatusBadGateway
}

// webPage reports whether a whole answer is markup (HTML or XML) rather than JSON or events:
// its first character, past white space and a byte order mark, opens a tag. No API answer of
// any of the formats starts so.
func webPage(body []byte) bool {
	t := metering.TrimBody(body)
	return len(t) > 0 && t[0] == '<'
}

// noAnswer reports whether a whole answer is text that no format answers with: not empty, not
// JSON (an object, or an array, which a provider's native API may answer with: metered as
// before, since the provider may have worked), and no event of it carries data (an event
// stream under another label does).
func noAnswer(body []byte, maxEvent int) bool {
	if t := metering.TrimBody(body); len(t) == 0 || t[0] == '{' || t[0] == '[' {
		return false
	}
	sc := metering.NewScanner(bytes.NewReader(body), maxEvent)
	for {
		ev, err := sc.Next()
		if err != nil {
			return true
		}
		if ev.Data != nil {
			return false
		}
	}
}

// wholeJSON reports whether b is a whole JSON object (white space and a byte order mark
// around it aside).
func wholeJSON(b []byte) bool {
	t := metering.TrimBody(b)
	return len(t) > 0 && t[0] == '{' && gjson.ValidBytes(t)
}

// cutJSON reports whether b (an event's data, a whole body) starts as a JSON object but is not
// whole JSON: what an upstream that went away mid-answer leaves. gjson's check, not
// encoding/json's: it runs on every whole answer, and takes 8 ms where that takes 18 on a
// 7 MB list of embeddings.
func cutJSON(b []byte) bool {
	t := metering.TrimBody(b)
	return len(t) > 0 && t[0] == '{' && !gjson.ValidBytes(t)
}

// oversizeReadFactor bounds how much of an answer too large to relay is still read for its
// usage: this many times max_response_bytes.
const oversizeReadFactor = 4

// oversizeTail is how much of the end of an answer too large to relay is kept: its usage
// report comes last, and is far smaller.
const oversizeTail = 256 << 10

// meterOversized meters an answer too large to relay from its head (the first bytes, which
// name the model) and the usage report at its end, reading and discarding the rest as it
// comes, up to most bytes. The provider bills what it made, whether or not the gateway can
// pass it on: a spoken answer in WAV passes the default 32 MiB after nine minutes, and was
// charged its prompt's estimate alone. Only an answer read to its end is metered: the report
// comes last, so one cut (past most, or broken) has none of its own, and a "usage" object
// found in it would be part of the answer (an Anthropic tool_use input is raw JSON the
// caller's schema shapes). It returns how many bytes it read past head.
func meterOversized(m *metering.Meter, head []byte, rest io.Reader, most int64) int64 {
	var tail []byte
	buf := make([]byte, 32<<10)
	var read int64
	var err error
	for read < most && err == nil {
		var n int
		n, err = rest.Read(buf[:min(int64(len(buf)), most-read)])
		read += int64(n)
		tail = append(tail, buf[:n]...)
		if len(tail) > 2*oversizeTail {
			tail = append(tail[:0], tail[len(tail)-oversizeTail:]...)
		}
	}
	ended := errors.Is(err, io.EOF)
	if err == nil {
		// Read up to the bound: the answer ended there only if nothing follows.
		var one [1]byte
		n, err := rest.Read(one[:])
		ended = n == 0 && errors.Is(err, io.EOF)
	}
	if !ended {
		return read
	}
	if len(tail) < oversizeTail {
		tail = append(head[max(0, len(head)-(oversizeTail-len(tail))):len(head):len(head)], tail...)
	}
	usage := lastUsage(tail)
	if !usage.IsObject() {
		return read
	}
	whole := []byte(`{"usage":` + usage.Raw)
	if model := gjson.GetBytes(head, "model"); model.Type == gjson.String {
		whole = append(append(whole, `,"model":`...), model.Raw...)
	}
	m.Body(append(whole, '}'))
	return read
}

// lastUsage is the value of the last "usage" key in b (a JSON body's end, or an event
// stream's) whose value is an object, or an empty result when that object is cut off or
// there is none. Linear in b: only the last key with an object value is read (a whole
// answer's report is its last), and a "usage" that is not a key (a value, text quoting the
// word) costs a few byte compares. Parsing from every occurrence, each from a copy of the
// rest of b, took 8 s of CPU on a 512 KiB tail of `"usage",`.
func lastUsage(b []byte) gjson.Result {
	key := []byte(`"usage"`)
	skip := func(i int) int {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
		return i
	}
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], key)
		if i < 0 {
			return gjson.Result{}
		}
		end = i
		if i > 0 && b[i-1] == '\\' {
			continue // inside a string
		}
		j := skip(i + len(key))
		if j >= len(b) || b[j] != ':' {
			continue // a value, not a key
		}
		if j = skip(j + 1); j >= len(b) || b[j] != '{' {
			continue // null, or no report
		}
		// Read as the first key of an object, so that the value ends where its braces do
		// (once: this is the last report, or there is none). A report cut off is none.
		if r := gjson.GetBytes(append([]byte{'{'}, b[i:]...), "usage"); r.IsObject() && gjson.Valid(r.Raw) {
			return r
		}
		return gjson.Result{}
	}
	return gjson.Result{}
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

// writeBound puts a deadline on writes to the caller (limits.client_write_timeout): the server
// sets none, since a stream may rightly last minutes, but a client that has stopped reading
// would otherwise block a write, and keep its call's hold, lease and reservation, for as long
// as it likes. The write then fails and the call ends as cancelled, charged what it used.
//
// The deadline is moved only once half of it has passed, not before every event: each move
// resets a runtime timer, and a stream writes thousands of events. So a stalled write fails
// after between half the timeout and the whole of it.
type writeBound struct {
	rc      *http.ResponseController
	timeout time.Duration
	setAt   time.Time
}

func (s *Server) boundWrites(rc *http.ResponseController) *writeBound {
	return &writeBound{rc: rc, timeout: s.cfg.Limits.ClientWriteTimeout}
}

// writePiece is the most written under one deadline: the timeout bounds a stall, not the
// time a large answer takes to reach a slow client that keeps reading.
const writePiece = 64 << 10

// write writes p to w in pieces, each with at least half the timeout, and returns how much
// of p was written, as io.Writer does.
func (b *writeBound) write(w io.Writer, p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), writePiece)
		b.next()
		m, err := w.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// next makes sure the coming write has at least half the timeout.
func (b *writeBound) next() {
	if now := time.Now(); now.Sub(b.setAt) >= b.timeout/2 {
		_ = b.rc.SetWriteDeadline(now.Add(b.timeout))
		b.setAt = now
	}
}

// maxUpstreamErrorBody bounds what is read of an upstream's error answer.
const maxUpstreamErrorBody = 64 << 10

// maxUpstreamHeaderBytes bounds an upstream answer's headers (status line included), as the
// server's MaxHeaderBytes bounds a caller's: the transport's default is 10 MB, kept for the
// whole call and copied to its caller.
const maxUpstreamHeaderBytes = 64 << 10

// headersTooLarge reports the transport's refusal of an answer whose headers passed
// maxUpstreamHeaderBytes (net/http exports no error value for it; HTTP/1 and HTTP/2 word it
// differently).
func headersTooLarge(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "server response headers exceeded") || strings.Contains(msg, "response header list larger than")
}

// relayUpstreamError answers for an upstream that refused the call. The caller's own mistakes
// (4xx) pass through as the provider worded them; the provider's failures and its refusal of
// the gateway's key become 502, since the caller can do nothing about them.
func (s *Server) relayUpstreamError(w http.ResponseWriter, resp *http.Response, upstream string, log *zap.Logger) int {
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamErrorBody+1))
	log.Warn("upstream refused the call", zap.String("upstream", upstream), zap.Int("status", resp.StatusCode),
		zap.ByteString("body", body[:min(len(body), 512)]), zap.NamedError("read_error", readErr))
	// An answer passed on cut (too large, or broken before its end) would be JSON no client can
	// parse, under a Content-Length of its own that hides the cut; one in an encoding the gateway
	// did not ask for (the transport decodes the gzip it asks for) is bytes it cannot read,
	// nor keep the operator's account ids out of. The status stays, the words are the
	// gateway's (the upstream's start is in the log line above), its retry advice (a 429's
	// Retry-After) the provider's. So is JSON that the redaction of the operator's account ids
	// would leave unparsable (an id the body words as a number, not in a string).
	enc := resp.Header.Get("Content-Encoding")
	tooLarge, encoded := len(body) > maxUpstreamErrorBody, enc != "" && !strings.EqualFold(enc, "identity")
	cut := readErr != nil && !tooLarge
	relayed := resp.StatusCode >= 400 && resp.StatusCode < 500 &&
		resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden
	var redacted []byte
	unparsable := false
	if relayed && !tooLarge && !encoded && !cut {
		redacted = redactAccountIDs(body, resp.Header)
		unparsable = !bytes.Equal(redacted, body) && json.Valid(body) && !json.Valid(redacted)
	}
	if relayed && (tooLarge || encoded || cut || unparsable) {
		why := fmt.Sprintf("over %d bytes", maxUpstreamErrorBody)
		switch {
		case cut:
			why = "broken before its end"
		case encoded && !tooLarge:
			why = "in an encoding the gateway did not ask for"
		case unparsable:
			why = "naming the gateway's account at the provider where it cannot be left out"
		}
		copyUpstreamHeaders(w.Header(), resp.Header, upstreamRetryHeaders)
		writeError(w, &apiError{Status: resp.StatusCode, Type: "invalid_request_error", Code: "upstream_refused",
			Message: fmt.Sprintf("The upstream refused the request with status %d; its error answer, %s, is not passed on.",
				resp.StatusCode, why)})
		return resp.StatusCode
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		// The gateway's own key, which the caller cannot change and a retry will not: SDKs
		// retry a 502 twice unless told not to.
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_auth_failed",
			Message: "The upstream refused the gateway's credentials.", NoRetry: true})
		return http.StatusBadGateway
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		body = redacted
		copyResponseHeaders(w.Header(), resp.Header)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		bound := s.boundWrites(http.NewResponseController(w))
		bound.next()
		w.WriteHeader(resp.StatusCode)
		_, _ = bound.write(w, body)
		return resp.StatusCode
	}
	// The provider's failure, in the gateway's words: what it said about retrying (an
	// overloaded provider's Retry-After, Anthropic's X-Should-Retry) goes on, so that an SDK
	// backs off or stops as the provider asked (its request id is already set: see forward).
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamRetryHeaders)
	writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_error",
		Message: fmt.Sprintf("The upstream failed with status %d.", resp.StatusCode)})
	return http.StatusBadGateway
}

// upstreamTraceHeaders name a call at its provider (OpenAI's X-Request-Id, Anthropic's
// Request-Id): an answer the gateway words itself after the provider answered (its 5xx, an
// answer that broke, was too large or was a web page) keeps them, as a relayed one does, so
// that a failure or a charge can be traced at the provider.
var upstreamTraceHeaders = []string{"X-Request-Id", "Request-Id"}

// upstreamRetryHeaders are a provider's advice on retrying, which the OpenAI and Anthropic SDKs
// follow (Retry-After-Ms first, then Retry-After; X-Should-Retry over the status).
var upstreamRetryHeaders = []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry"}

// copyUpstreamHeaders copies the named headers of src, those it has, to dst.
func copyUpstreamHeaders(dst, src http.Header, names ...[]string) {
	for _, list := range names {
		for _, k := range list {
			if vv := src.Values(k); len(vv) > 0 {
				dst[http.CanonicalHeaderKey(k)] = vv
			}
		}
	}
}

// upstreamRequestID is the provider's id of the call, as a log field (ok false when it sent
// none): support traces a failed or charged call from its run id in the log to the provider's
// id. Bounded: a header value may be up to the 64 KiB of all of them.
func upstreamRequestID(resp *http.Response) (_ zap.Field, ok bool) {
	for _, k := range upstreamTraceHeaders {
		if id := resp.Header.Get(k); id != "" {
			return zap.String("upstream_request_id", id[:min(len(id), 256)]), true
		}
	}
	return zap.Field{}, false
}

// operatorAccountIDs match the ids of the operator's account at the provider that an error
// answer may word (OpenAI's rate-limit refusals name the organisation, "Rate limit reached
// for gpt-4o in organization org-… on tokens per min", and the project): they describe the
// operator's account, not the caller's request, and the gateway keeps them from callers in
// headers (dropResponseHeaders) as in words.
var operatorAccountIDs = regexp.MustCompile(`\b(org-|proj_)[A-Za-z0-9]{8,}`)

// redactAccountID keeps an id's kind and drops the id.
func redactAccountID(id []byte) []byte {
	if bytes.HasPrefix(id, []byte("org-")) {
		return []byte("org-(redacted)")
	}
	return []byte("proj_(redacted)")
}

// anthropicOrganization matches the operator's organisation id, a UUID, where Anthropic's
// rate-limit refusals word it: "the rate limit for your organization (0dccdde6-…) of 20,000
// input tokens per minute", and later "… per minute (org: 8016…, model: …)". Only after those
// words: a UUID elsewhere in an error may be the caller's own (an id it sent, quoted back).
var anthropicOrganization = regexp.MustCompile(`(?i)(organization\s*\(\s*|\borg:\s*)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)

// accountHeaders name the operator's account at the provider in an answer's headers, which
// dropResponseHeaders keeps from callers; their values are kept out of a relayed body too.
var accountHeaders = []string{"Openai-Organization", "Openai-Project", "Anthropic-Organization-Id"}

// minAccountIDLen is the shortest account header value looked for in a body: a shorter one
// (a placeholder, "none") would take words of the message with it.
const minAccountIDLen = 8

// maxAccountIDValues bounds the values of one account header looked for in a body, each a
// pass over it: an account has one id, and thousands of values (what 64 KiB of headers
// holds) cost a pass each, a fifth of a second of CPU per refusal.
const maxAccountIDValues = 4

// redactAccountIDs replaces the ids of the operator's account at the provider that an error
// body words — OpenAI's org- and proj_ ids, Anthropic's organisation UUID, and wherever they
// stand, the values of the answer's own account headers (h) — by "(redacted)", keeping what
// kind of id it was.
func redactAccountIDs(body []byte, h http.Header) []byte {
	body = operatorAccountIDs.ReplaceAllFunc(body, redactAccountID)
	body = anthropicOrganization.ReplaceAll(body, []byte("${1}(redacted)"))
	for _, k := range accountHeaders {
		vals := h.Values(k)
		for _, v := range vals[:min(len(vals), maxAccountIDValues)] {
			if v = strings.TrimSpace(v); len(v) >= minAccountIDLen {
				body = bytes.ReplaceAll(body, []byte(v), []byte("(redacted)"))
			}
		}
	}
	return body
}

// upstreamRequest builds the request to upstream's path: body (rewritten for a call), the
// caller's query and headers less the ones that belong to this hop or to the gateway, and
// the upstream's key.
func (s *Server) upstreamRequest(ctx context.Context, r *http.Request, upstream *config.Upstream, path string, body []byte) (*http.Request, error) {
	u := strings.TrimSuffix(upstream.BaseURL, "/") + path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("upstream request %s: %w", u, err)
	}
	hop := connectionListed(r.Header)
	for k, vv := range r.Header {
		// A name with an underscore is dropped as nginx and Apache drop it: CGI-style servers
		// read X_Api_Key as X-Api-Key, which would get past the list below.
		if _, drop := dropRequestHeaders[k]; !drop && !hop[k] && !strings.Contains(k, "_") {
			up.Header[k] = vv
		}
	}
	up.Header.Set("Content-Type", "application/json")
	key := upstream.APIKey
	switch upstream.Kind {
	case "anthropic":
		if key != "" {
			up.Header.Set("X-Api-Key", key)
		}
		if up.Header.Get("Anthropic-Version") == "" {
			up.Header.Set("Anthropic-Version", "2023-06-01")
		}
	default:
		if key != "" {
			up.Header.Set("Authorization", "Bearer "+key)
		}
	}
	return up, nil
}

// dropRequestHeaders never reach the upstream: hop-by-hop headers, the caller's credentials
// (in any provider's spelling: Azure's api-key too), claims about the client's address or the
// URL or method it used (the upstream or a proxy in front of it may trust them: a token count
// rerouted to a model call would be served free), the gateway's own
// headers, X-Idempotency-Key (with it Go's transport resends a request whose reused
// connection broke after it was written: the provider may run it twice, charged once), and
// Accept-Encoding (the meter must read plain text; the transport negotiates compression
// itself and decompresses).
var dropRequestHeaders = setOf("Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect", "Content-Encoding", "Authorization", "X-Api-Key", "Api-Key", "Cookie", "Accept-Encoding",
	"Content-Length", "Host", "X-Run-Id", "Idempotency-Key", "X-Idempotency-Key", "X-Session-Id", "Openai-Organization", "Openai-Project",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server",
	"Forwarded", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip", "Cf-Connecting-Ip", "X-Original-Url", "X-Rewrite-Url",
	"X-Original-Uri", "X-Forwarded-Uri", "X-Envoy-Original-Path", "X-Http-Method-Override", "X-Method-Override", "X-Http-Method")

// dropResponseHeaders are hop-by-hop, set by the gateway (an upstream that is itself a
// gateway must not rename the caller's run or mark a first answer as a replay), or name the
// operator's account at the provider (its organisation and project), which is not the caller's.
var dropResponseHeaders = setOf("Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Set-Cookie", RunIDHeader, ReplayedHeader, "Openai-Organization", "Openai-Project", "Anthropic-Organization-Id")

func copyResponseHeaders(dst, src http.Header) {
	hop := connectionListed(src)
	for k, vv := range src {
		if _, drop := dropResponseHeaders[k]; !drop && !hop[k] {
			dst[k] = vv
		}
	}
}

// connectionListed returns the (canonical) names h's Connection header lists: hop-by-hop
// for that message alone (RFC 9110 §7.6.1), whatever their name, so never passed on, as
// the fixed lists above are not. nil when it lists none.
func connectionListed(h http.Header) map[string]bool {
	var names map[string]bool
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if names == nil {
					names = make(map[string]bool)
				}
				names[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return names
}

func setOf(names ...string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[http.CanonicalHeaderKey(n)] = struct{}{}
	}
	return m
}
