package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi"
)

// The admin API's query parameters and request bodies: each refusal is a 400 that names what
// was wrong, before the store is asked anything.

// takes serves h only if the request's query names no parameter but those names: a filter
// misspelt (userr=bob) was ignored, and a listing or report meant for one user answered for
// every user. A body's misspelt field is refused the same way (readJSON). A parameter given
// twice is refused too: only its first value was read, so ?user=alice&user=bob reported alice
// alone.
//
// A query Go cannot read whole is refused too: URL.Query drops without an error each pair it
// cannot decode (a bad percent escape, a semicolon), so ?user=ann%zz or ?user=ann;state=settled
// lost its filter and answered every user's rows.
func takes(h http.HandlerFunc, names ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		query, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			writeError(w, badRequest("invalid_request",
				fmt.Sprintf("the query string cannot be read (%v): percent-encode its values and separate parameters with &", err)))
			return
		}
		for k, vs := range query {
			if !slices.Contains(names, k) {
				allowed := strings.Join(names, ", ")
				if allowed == "" {
					allowed = "none"
				}
				writeError(w, badRequest("unknown_parameter",
					fmt.Sprintf("unknown query parameter %q; this route takes: %s", k[:min(len(k), 64)], allowed)))
				return
			}
			if len(vs) > 1 {
				writeError(w, badRequest("invalid_request",
					fmt.Sprintf("query parameter %q given %d times; give it once", k, len(vs))))
				return
			}
		}
		h(w, r)
	}
}

// noBody serves h, a route that reads no body, only if the request has none, or an empty
// object: a body it would not read ({"expires_in":3600} on a key's creation) is refused
// rather than ignored.
func noBody(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, ok := readBody(w, r)
		if !ok {
			return
		}
		var fields map[string]json.RawMessage
		if len(bytes.TrimSpace(raw)) > 0 && (json.Unmarshal(raw, &fields) != nil || fields == nil || len(fields) > 0) {
			writeError(w, badRequest("invalid_json", "this route takes no request body: send none, or {}"))
			return
		}
		h(w, r)
	}
}

// limitParam reads a listing's page size: bounded, so that no request reads a table whole.
func limitParam(r *http.Request) (int, *apiError) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return defaultListLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxListLimit {
		return 0, badRequest("invalid_limit", fmt.Sprintf("limit must be 1-%d", MaxListLimit))
	}
	return n, nil
}

// idParam reads the after parameter of a listing paged by a numeric id (0: from the start).
// what names the id in the answer that refuses it.
func idParam(r *http.Request, what string) (uint64, *apiError) {
	s := r.URL.Query().Get("after")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, badRequest("invalid_after", "after must be the last_id of the previous page ("+what+")")
	}
	return n, nil
}

// ParseTime reads an RFC 3339 time or a UTC date (its midnight); "" is the zero time. The
// API's since/until parameters and the CLI's -since/-until flags both take it.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a YYYY-MM-DD date", s)
	}
	return t, nil
}

// dateParam reads a YYYY-MM-DD day; "" is def.
func dateParam(s string, def time.Time) (time.Time, error) {
	if s == "" {
		return def, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a YYYY-MM-DD date", s)
	}
	return t, nil
}

// readJSON decodes a bounded body strictly: unknown fields, and fields named twice or in
// another case (fieldsAsSpelt), are refused, so a misspelt field ("ammount") fails loudly
// instead of granting nothing. On failure it has answered.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	raw, ok := readBody(w, r)
	if !ok {
		return false
	}
	if err := fieldsAsSpelt(raw, v); err != nil {
		writeError(w, badRequest("invalid_json", "request body is not the expected JSON: "+err.Error()))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, badRequest("invalid_json", "request body is not the expected JSON: "+err.Error()))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, badRequest("invalid_json", "request body has data after the JSON object"))
		return false
	}
	return true
}

// readBody reads a request's body whole, up to maxBodyBytes, for readJSON and noBody: both
// must see all of it (a field named twice, a body where none is taken) before they decide. On
// failure it has answered.
//
// The read ends with the request's bound (requestTimeout, its context's deadline): the server
// sets no read timeout, and a body that stopped arriving held the connection and its goroutine
// for as long as the client stayed. A Content-Length over the limit is refused before anything
// is read, so a client waiting on Expect: 100-continue is not told to send it.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if ce, ok := httpapi.ContentEncoding(r.Header); ok {
		// Refused by name: read as sent, a gzip body was 400 invalid_json ("invalid character
		// '\x1f'"), and a plain one labelled gzip was taken.
		writeError(w, &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("Request bodies sent with Content-Encoding %q are not supported; send the JSON uncompressed.", quoted(ce))})
		return nil, false
	}
	if r.ContentLength > maxBodyBytes {
		w.Header().Set("Connection", "close")
		writeError(w, errBodyTooLarge)
		return nil, false
	}
	rc := http.NewResponseController(w)
	if d, ok := r.Context().Deadline(); ok {
		_ = rc.SetReadDeadline(d)
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	// Lifted at once: left on the connection, it would end the server's background read, and
	// with it the request's context, while the write goes on.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		// What is left of the body is not read: the server would drain it with no deadline.
		w.Header().Set("Connection", "close")
	}
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		writeError(w, errBodyTooLarge)
		return nil, false
	case errors.As(err, &ne) && ne.Timeout():
		writeError(w, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
			Code: "request_timeout", Message: "The request body stopped arriving."})
		return nil, false
	case err != nil:
		writeError(w, badRequest("invalid_json", "request body could not be read: "+err.Error()))
		return nil, false
	}
	return raw, true
}

// errBodyTooLarge refuses a body over maxBodyBytes.
var errBodyTooLarge = &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
	Code: "body_too_large", Message: fmt.Sprintf("Request body over %d bytes.", maxBodyBytes)}

// fieldsAsSpelt refuses a body object that names a member twice, or names one in another case
// than v's field: encoding/json keeps the last of two members and matches names without
// regard to case, so {"amount":"1","AMOUNT":"1000"} granted 1000 credits where a log, a
// reviewer or a parser that keeps the first read 1. What is not an object is left to the
// decoder to refuse.
func fieldsAsSpelt(raw []byte, v any) error {
	known := map[string]bool{}
	if t := reflect.TypeOf(v); t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		for i := 0; i < t.Elem().NumField(); i++ {
			name, _, _ := strings.Cut(t.Elem().Field(i).Tag.Get("json"), ",")
			known[name] = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil // malformed: the decoder says how
		}
		name, _ := tok.(string)
		if seen[name] {
			return fmt.Errorf("field %q given twice", name[:min(len(name), 64)])
		}
		seen[name] = true
		if !known[name] {
			return fmt.Errorf("unknown field %q (fields are spelt as documented, in lower case)", name[:min(len(name), 64)])
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}
