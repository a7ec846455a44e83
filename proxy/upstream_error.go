package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.uber.org/zap"
)

// maxUpstreamErrorBody bounds what is read of an upstream's error answer.
const maxUpstreamErrorBody = 64 << 10

// relayUpstreamError answers for an upstream that refused the call. The caller's own mistakes
// (4xx) pass through as the provider worded them; the provider's failures and its refusal of
// the gateway's key become 502, since the caller can do nothing about them.
func (s *Server) relayUpstreamError(w http.ResponseWriter, resp *http.Response, upstream string, log *zap.Logger) int {
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamErrorBody+1))
	msg := "upstream refused the call"
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		// The gateway's key, not the caller's mistake: every call to this upstream fails until
		// the operator fixes it. WARN (sampled) as the other upstream failures, under its own
		// message, which the sampling counts apart.
		msg = "upstream refused the gateway's credentials: check this upstream's API key (UPSTREAM_API_KEY or its api_key_env)"
	}
	log.Warn(msg, zap.String("upstream", upstream), zap.Int("status", resp.StatusCode),
		zap.ByteString("body", logged(body)), zap.NamedError("read_error", readErr))
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
			return zap.String("upstream_request_id", logged(id)), true
		}
	}
	return zap.Field{}, false
}
