package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"

	"go.uber.org/zap"
)

// forward sends the call upstream and copies the answer back, feeding every byte to the
// meter on the way. It returns the status the client saw and sets c.outcome.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, c *call) int {
	// The upstream call is bound to the client's request: a client that leaves stops the
	// generation, and with it the cost.
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.UpstreamTimeout)
	defer cancel()
	resp, status := s.sendUpstream(ctx, w, r, c)
	if resp == nil {
		return status
	}
	defer resp.Body.Close()
	// Whatever of the answer's headers quotes the operator's key is left out of all that
	// follows: the headers relayed, recorded and logged.
	redactHeaderKey(resp.Header, c.req.upstream.APIKey)
	// The provider's id of the call goes with every answer to it, the gateway's own errors
	// included, and with every later log line of the call.
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamTraceHeaders)
	if f, ok := upstreamRequestID(resp, c.req.upstream); ok {
		c.log = c.log.With(f)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		c.outcome = outcomeUpstreamError
		return s.relayUpstreamError(w, r, resp, c.req.upstream, c.log, "call ended before its answer")
	}
	if ce := unaskedEncoding(resp.Header); ce != "" {
		return refuseUnaskedEncoding(w, c, ce)
	}
	// A call that did not ask for a stream is answered whole, whatever its label says: a JSON
	// body under text/event-stream would read as no event at all and go unmetered (relayBody
	// meters a stream that came unasked as a stream).
	if c.req.stream && isEventStream(resp.Header.Get("Content-Type")) {
		return s.relayStream(w, r, resp, c, cancel)
	}
	return s.relayBody(w, r, resp, c)
}

// sendUpstream sends the call's request upstream under ctx and returns the answer with its
// headers, or nil and the status of the answer written instead (c.outcome set) when there is
// none to relay.
func (s *Server) sendUpstream(ctx context.Context, w http.ResponseWriter, r *http.Request, c *call) (*http.Response, int) {
	// Whether the provider has the whole request decides what a timeout costs
	// (answerForwardFailure), and a panic (finish).
	// (A connection the transport retries on starts unsent again.)
	sent := &c.sent
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { sent.Store(false) },
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	})
	ctx, headersLate := headerWait(ctx, c.req.stream, s.cfg.Limits.HeaderTimeout)
	up, err := s.upstreamRequest(ctx, r, c.req.upstream, c.req.route.path, c.req.body)
	if err != nil {
		headersLate()
		c.outcome = outcomeRefused
		c.log.Error("build upstream request", zap.Error(loggedUpstreamErr(c.req.upstream, err)))
		w.Header().Del(RunIDHeader) // never forwarded: released at 0, a refusal names no run
		writeError(w, errBuildUpstream)
		return nil, http.StatusInternalServerError
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
	if err != nil {
		return nil, s.answerForwardFailure(w, r, c, err, sent.Load()) // read once, as the request failed
	}
	s.metrics.upstreamPhase.Observe(time.Since(sending).Seconds())
	return resp, 0
}

// refuseUnaskedEncoding answers 502 an answer in an encoding the gateway did not ask for (ce).
// The gateway asks for gzip and decodes it (gunzipping); any other encoding was not asked for and
// cannot be metered. Nothing is served that cannot be charged: the provider had the
// prompt, so the call is charged its estimate, as a stream that broke.
func refuseUnaskedEncoding(w http.ResponseWriter, c *call, ce string) int {
	c.outcome = outcomeStreamError
	c.log.Warn("upstream answered in an encoding it was not asked for", zap.String("content_encoding", loggedUpstream(c.req.upstream, ce)))
	// Not to be retried: the provider answers a retry the same way, charged again.
	writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
		Message: "The upstream answered in an encoding the gateway did not ask for.", NoRetry: true})
	return http.StatusBadGateway
}

// answerForwardFailure answers a call whose upstream request failed before its headers came,
// and sets c.outcome by what the provider may have used: sent says whether it had the whole
// request, which decides what the failure costs.
func (s *Server) answerForwardFailure(w http.ResponseWriter, r *http.Request, c *call, err error, sent bool) int {
	if requestEnded(r) {
		// If the provider has the prompt, charge the estimate of it; if the request never
		// reached it whole, nothing was used.
		c.outcome = outcomeCancel
		step := "before the upstream's answer; charged its prompt's estimate"
		if !sent {
			// Refused as before forwarding, and answered as such (handleCall's 409 to a
			// call a newer message of its session replaced): no run named, since none
			// reached the provider, and the one held is released at 0.
			c.outcome = outcomeRefused
			w.Header().Del(RunIDHeader)
			step = "before the request reached the upstream; hold released"
		}
		logEndedBeforeAnswer(c, r, step, err)
		return answerCallEnded(w, r, c)
	}
	if headersTooLarge(err) && sent {
		// The provider had the prompt and answered, with headers past the bound: as an
		// answer in an encoding not asked for, it cannot be relayed and is charged its
		// estimate, and a retry would be answered the same way.
		c.outcome = outcomeStreamError
		c.log.Warn("upstream answered with headers over the bound", zap.String("upstream", c.req.upstream.Name),
			zap.Int("limit", maxUpstreamHeaderBytes), zap.Error(loggedUpstreamErr(c.req.upstream, err)))
		writeCallError(w, c, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_broken",
			Message: fmt.Sprintf("The upstream answered with more than %d bytes of headers.", maxUpstreamHeaderBytes), NoRetry: true})
		return http.StatusBadGateway
	}
	c.outcome = outcomeUpstreamError
	e := &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_unreachable",
		Message: "The upstream could not be reached."}
	if isTimeout(err) {
		e = &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
			Message: "The upstream did not answer in time."}
		if sent {
			// The provider took the prompt and was still working on it when the gateway
			// gave up, as when a client leaves: charge the estimate of the prompt.
			c.outcome = outcomeUpstreamTimeout
		}
	}
	c.log.Warn("upstream request failed", zap.String("upstream", c.req.upstream.Name), zap.Error(loggedUpstreamErr(c.req.upstream, err)))
	writeCallError(w, c, e)
	return e.Status
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

// maxUpstreamHeaderBytes bounds an upstream answer's headers (status line included), as the
// server's MaxHeaderBytes bounds a caller's: the transport's default is 10 MB, kept for the
// whole call and copied to its caller.
const maxUpstreamHeaderBytes = 64 << 10

// headersTooLarge reports the transport's refusal of an answer whose headers passed
// maxUpstreamHeaderBytes (net/http exports no error value for it; HTTP/1 and HTTP/2 word it
// differently, and HTTP/2 words the 1xx answers' part apart: "header list too large").
func headersTooLarge(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "server response headers exceeded") || strings.Contains(msg, "response header list larger than") ||
		strings.Contains(msg, "header list too large")
}
