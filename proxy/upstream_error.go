package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
)

// maxUpstreamErrorBody bounds what is read of an upstream's error answer.
const maxUpstreamErrorBody = 64 << 10

// relayUpstreamError answers for an upstream that refused the call. The caller's own mistakes
// (4xx) pass through as the provider worded them; the provider's failures and its refusal of
// the gateway's key or of the operator's account there (401, 403, 407, 402, OpenAI's 429
// insufficient_quota, Anthropic's 400 "Your credit balance is too low") become 502, since the caller can do nothing about them.
// What it quotes of the upstream's words never holds the upstream's key (redactKey).
//
// A refusal whose body could not be read because the caller left, or because the call's time
// ran out, is answered for that (unreadErrorAnswer), as it would be before the headers came:
// a caller that left was no upstream failure, nor a body that stalled a broken one. endedMsg
// is the message of the line of a caller that left.
func (s *Server) relayUpstreamError(w http.ResponseWriter, r *http.Request, resp *http.Response, up *config.Upstream, log *zap.Logger, endedMsg string) int {
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamErrorBody+1))
	// An echo of the operator's key is left out of the log line and of the answer alike.
	body = redactKey(body, up.APIKey)
	if readErr != nil && (requestEnded(r) || isTimeout(readErr)) {
		return unreadErrorAnswer(w, r, resp, up, log, endedMsg, body, readErr)
	}
	accountRefused := resp.StatusCode == http.StatusPaymentRequired ||
		(resp.StatusCode == http.StatusTooManyRequests && quotaExhausted(body)) ||
		(resp.StatusCode == http.StatusBadRequest && creditBalanceTooLow(body))
	msg := "upstream refused the call"
	switch {
	case credentialsRefused(resp.StatusCode):
		// The gateway's key, not the caller's mistake: every call to this upstream fails until
		// the operator fixes it. WARN (sampled) as the other upstream failures, under its own
		// message, which the sampling counts apart.
		msg = "upstream refused the gateway's credentials: check this upstream's API key (UPSTREAM_API_KEY or its api_key_env), or on 407 the outbound proxy's"
	case accountRefused:
		msg = "upstream refused to bill the gateway's account: check its balance at this upstream"
	}
	log.Warn(msg, zap.String("upstream", up.Name), zap.Int("status", resp.StatusCode),
		zap.String("body", loggedUpstream(up, body)), zap.NamedError("read_error", loggedUpstreamErr(up, readErr)))
	switch {
	case credentialsRefused(resp.StatusCode):
		// The gateway's own key, which the caller cannot change and a retry will not: SDKs
		// retry a 502 twice unless told not to.
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_auth_failed",
			Message: "The upstream refused the gateway's credentials.", NoRetry: true})
		return http.StatusBadGateway
	case accountRefused:
		// The provider will not bill the operator's account there (its balance, its credits,
		// its quota): no mistake of the caller's, as its 401 is none. Passed on, a 402 read as
		// the gateway's own insufficient_credits, the caller's balance, a 429 as a rate limit
		// to wait out (SDKs retry it), and Anthropic's 400 told the caller, in words, that its
		// credit balance was too low. A retry is refused the same way until the
		// operator pays.
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_error",
			Message: fmt.Sprintf("The upstream refused to bill the gateway's account (status %d).", resp.StatusCode), NoRetry: true})
		return http.StatusBadGateway
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return s.relayCallerError(w, resp, body, readErr)
	}
	// The provider's failure, in the gateway's words: what it said about retrying (an
	// overloaded provider's Retry-After, Anthropic's X-Should-Retry) goes on, so that an SDK
	// backs off or stops as the provider asked (its request id is already set: see forward).
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamRetryHeaders)
	writeError(w, &apiError{Status: http.StatusBadGateway, Type: "api_error", Code: "upstream_error",
		Message: fmt.Sprintf("The upstream failed with status %d.", resp.StatusCode)})
	return http.StatusBadGateway
}

// creditBalanceTooLow reports whether a 400's body is Anthropic's refusal of an account out of
// credit ("Your credit balance is too low to access the Anthropic API. Please go to Plans &
// Billing …", type invalid_request_error, on its token counter too): the operator's account,
// as a 402 is, which passed on told the caller in words that its own balance was too low. Read
// from the start of the message alone, so that a caller's words an error quotes do not make
// its own mistake look like the operator's.
func creditBalanceTooLow(body []byte) bool {
	msg := strings.TrimSpace(gjson.GetBytes(body, "error.message").String())
	return len(msg) >= len(anthropicNoCredit) && strings.EqualFold(msg[:len(anthropicNoCredit)], anthropicNoCredit)
}

// anthropicNoCredit is how Anthropic's refusal of an account out of credit begins.
const anthropicNoCredit = "Your credit balance is too low"

// credentialsRefused reports whether status refuses the gateway's own credentials: its key at
// the provider (401, 403), or at an outbound proxy on the way there (407, which passed on would
// ask the caller's client for its own proxy's credentials).
func credentialsRefused(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusProxyAuthRequired
}

// unreadErrorAnswer answers an upstream's refusal whose body (read: body) was cut by readErr
// because the caller left (499 client_closed_request, or 503 shutting_down when the drain's
// deadline cut it; a call superseded by a newer message of its session is answered by its
// caller) or the call's time ran out (504 upstream_timeout). The provider refused the call,
// so it is charged nothing whichever: only its answer, its count and its line change.
func unreadErrorAnswer(w http.ResponseWriter, r *http.Request, resp *http.Response, up *config.Upstream, log *zap.Logger,
	endedMsg string, body []byte, readErr error) int {
	fields := []zap.Field{zap.String("upstream", up.Name), zap.Int("upstream_status", resp.StatusCode), zap.String("body", loggedUpstream(up, body))}
	readErr = loggedUpstreamErr(up, readErr) // only logged from here on
	if requestEnded(r) {
		if !errors.Is(context.Cause(r.Context()), errSuperseded) {
			e, why := ended(r.Context(), "while the upstream's refusal was read")
			logRefusalAs(log, endedMsg, e, why, readErr, fields...)
		}
		return answerClientClosed(w, r)
	}
	log.Warn("upstream refusal too slow", append(fields, zap.Error(readErr))...)
	copyUpstreamHeaders(w.Header(), resp.Header, upstreamRetryHeaders)
	writeError(w, &apiError{Status: http.StatusGatewayTimeout, Type: "api_error", Code: "upstream_timeout",
		Message: fmt.Sprintf("The upstream refused the call with status %d and did not finish saying why in time.", resp.StatusCode)})
	return http.StatusGatewayTimeout
}

// relayCallerError passes on an upstream's refusal of the caller's own mistake (a 4xx, the
// gateway's credentials aside) as the provider worded it, or, when that answer cannot be
// passed on (relayableErrorBody), says so in the gateway's words under the same status.
func (s *Server) relayCallerError(w http.ResponseWriter, resp *http.Response, body []byte, readErr error) int {
	body, whyNot := relayableErrorBody(resp, body, readErr)
	if whyNot != "" {
		copyUpstreamHeaders(w.Header(), resp.Header, upstreamRetryHeaders)
		writeError(w, &apiError{Status: resp.StatusCode, Type: "invalid_request_error", Code: "upstream_refused",
			Message: fmt.Sprintf("The upstream refused the request with status %d; its error answer, %s, is not passed on.",
				resp.StatusCode, whyNot)})
		return resp.StatusCode
	}
	copyResponseHeaders(w.Header(), resp.Header)
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	bound := s.boundWrites(http.NewResponseController(w))
	bound.next()
	w.WriteHeader(resp.StatusCode)
	_, _ = bound.write(w, body)
	return resp.StatusCode
}

// relayableErrorBody is an upstream's error answer (body, as read: readErr, up to one byte past
// maxUpstreamErrorBody) as it may be passed on, the operator's account ids left out
// (redactAccountIDs); or, when it may not be, why not.
//
// An answer passed on cut (too large, or broken before its end) would be JSON no client can
// parse, under a Content-Length of its own that hides the cut; one in an encoding the gateway
// did not ask for (gunzipping decodes the gzip it asks for) is bytes it cannot read,
// nor keep the operator's account ids out of. The status stays, the words are the
// gateway's (the upstream's start is in relayUpstreamError's log line), its retry advice
// (a 429's Retry-After) the provider's. So is JSON that the redaction of the operator's
// account ids would leave unparsable (an id the body words as a number, not in a string).
func relayableErrorBody(resp *http.Response, body []byte, readErr error) (redacted []byte, whyNot string) {
	tooLarge, encoded := len(body) > maxUpstreamErrorBody, unaskedEncoding(resp.Header) != ""
	switch {
	case readErr != nil && !tooLarge:
		return nil, "broken before its end"
	case tooLarge:
		return nil, fmt.Sprintf("over %d bytes", maxUpstreamErrorBody)
	case encoded:
		return nil, "in an encoding the gateway did not ask for"
	}
	redacted = redactAccountIDs(body, resp.Header)
	if !bytes.Equal(redacted, body) && json.Valid(body) && !json.Valid(redacted) {
		return nil, "naming the gateway's account at the provider where it cannot be left out"
	}
	return redacted, ""
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
// id. Bounded: a header value may be up to the 64 KiB of all of them (loggedUpstream).
func upstreamRequestID(resp *http.Response, up *config.Upstream) (_ zap.Field, ok bool) {
	for _, k := range upstreamTraceHeaders {
		if id := resp.Header.Get(k); id != "" {
			return zap.String("upstream_request_id", loggedUpstream(up, id)), true
		}
	}
	return zap.Field{}, false
}

// quotaExhausted reports whether a 429's body is OpenAI's refusal of an account out of credit
// ("insufficient_quota", as its code or its type), not a rate limit: one retries the same way
// until someone pays, the other passes.
func quotaExhausted(body []byte) bool {
	e := gjson.GetBytes(body, "error")
	return e.Get("code").String() == "insufficient_quota" || e.Get("type").String() == "insufficient_quota"
}
