// Package httpapi is what the gateway's two HTTP APIs, the model API (proxy) and the operator
// API (admin), say alike: JSON answers, errors in OpenAI's shape, retry advice in whole
// seconds, and Bearer credentials. One client library reads both APIs' answers, and with one
// copy of each the two cannot drift apart. What only one of them says (the proxy's run ids,
// its X-Should-Retry and Anthropic's error shape on its route) stays with it.
//
// A leaf: it imports the standard library only, and proxy and admin import it.
package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WriteJSON sends v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ErrorCounter counts the error answers written (CountError) to a ResponseWriter that is, or
// wraps, it: the gateway's router puts one around every request, so that each API's one
// error writer counts its answers in one series without being handed the metrics.
type ErrorCounter interface {
	CountError(status int, code string)
}

// CountError tells the ErrorCounter that w is or wraps (through Unwrap, as
// http.ResponseController reaches a connection) of an error answer of status and code; a
// writer with none, as in a handler's own test, counts nothing.
func CountError(w http.ResponseWriter, status int, code string) {
	for {
		if c, ok := w.(ErrorCounter); ok {
			c.CountError(status, code)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// ErrorBody is an error answer's "error" object in OpenAI's shape,
// {"error":{"message","type","code"}}, which every OpenAI SDK already knows how to read. It is
// a map so that an API can add its own fields beside these.
func ErrorBody(message, typ, code string) map[string]any {
	return map[string]any{"message": message, "type": typ, "code": code}
}

// SetRetryAfter sets Retry-After to d in whole seconds, rounded up: the header carries no
// fraction, and rounded down, a wait under a second would tell the client to retry at once.
func SetRetryAfter(h http.Header, d time.Duration) {
	h.Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}

// BearerCredentials returns the credentials of a Bearer Authorization header value, trimmed
// of spaces, and false when v is not of the Bearer scheme or carries none: "Bearer " alone is
// no credential, so that a route with another place for the key (x-api-key) looks there. The
// scheme is matched case-insensitively (RFC 9110 §11.1): "bearer <key>" is the same credential.
func BearerCredentials(v string) (string, bool) {
	const scheme = "Bearer "
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	c := strings.TrimSpace(v[len(scheme):])
	return c, c != ""
}

// AllowedMethods lists the methods served reports a route for, for the Allow header of a 405
// (RFC 9110 requires it): chi hands a custom 405 handler no such list, so each API asks its
// router again, method by method, on the path as it routes it. HEAD comes with GET, which
// answers it.
func AllowedMethods(served func(method string) bool) []string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if served(m) {
			out = append(out, m)
			if m == http.MethodGet {
				out = append(out, http.MethodHead)
			}
		}
	}
	return out
}

// ContentEncoding returns the first coding other than identity that h's Content-Encoding
// lines name, and false when there is none. Both APIs read a body as the JSON it is sent as:
// a compressed one is refused 415 by name rather than misread as invalid JSON, or, on the
// model API, forwarded plain under a header telling the upstream to decompress it.
func ContentEncoding(h http.Header) (string, bool) {
	for _, v := range h.Values("Content-Encoding") {
		for _, ce := range strings.Split(v, ",") {
			if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
				return ce, true
			}
		}
	}
	return "", false
}
