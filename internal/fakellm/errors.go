package fakellm

import (
	"errors"
	"io"
	"net/http"
	"strconv"
)

// writeError answers in the error shape of the API the route imitates, because
// the gateway parses upstream errors per wire format and must be tested against
// both.
func writeError(w http.ResponseWriter, status int, anth bool, typ, msg string) {
	var b []byte
	if anth {
		b = append(b, `{"type":"error","error":{"type":`...)
		b = strconv.AppendQuote(b, typ)
		b = append(b, `,"message":`...)
		b = appendString(b, msg)
		b = append(b, "}}\n"...)
	} else {
		b = append(b, `{"error":{"message":`...)
		b = appendString(b, msg)
		b = append(b, `,"type":`...)
		b = strconv.AppendQuote(b, typ)
		b = append(b, `,"param":null,"code":null}}`+"\n"...)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// statusType names an error status the way the provider would.
func statusType(status int, anth bool) string {
	switch {
	case status == 400:
		return "invalid_request_error"
	case status == 401:
		return "authentication_error"
	case status == 403:
		return "permission_error"
	case status == 404:
		return "not_found_error"
	case status == 413:
		return "request_too_large"
	case status == 429:
		return "rate_limit_error"
	case status == 529 && anth:
		return "overloaded_error"
	case status >= 500 && anth:
		return "api_error"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

// readBody bounds the body so a runaway client cannot exhaust the benchmark
// host; it returns the HTTP status that fits the failure.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, errors.New("request body too large")
		}
		return nil, http.StatusBadRequest, errors.New("reading request body: " + err.Error())
	}
	return body, 0, nil
}

// appendString appends s as a JSON string literal. Only messages built from
// request headers go through it, so the simple escaping of control characters,
// quotes and backslashes is all JSON requires.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
