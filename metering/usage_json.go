package metering

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// Reading the names, counts and text lengths of an answer's JSON values.

// keepName copies v into *dst when it is a name: a non-empty string no longer than
// maxModelName (longer is no name a price or a later request could match). Only the first
// unless replace. A copy: the event's memory is reused.
func keepName(dst *string, v gjson.Result, replace bool) (kept bool) {
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > maxModelName || (*dst != "" && !replace) {
		return false
	}
	*dst = strings.Clone(v.Str)
	return true
}

// eventType is the data's "type", which both typed formats always send; the SSE event name
// stands in for it only when a relay has dropped it.
func eventType(s, name string) string {
	if t := gjson.Get(s, "type"); t.Type == gjson.String {
		return t.Str
	}
	return name
}

// first returns the first of the paths in u that holds a count (tokenCount); a null, or
// anything else that is no number, counts as absent.
func first(u gjson.Result, paths ...string) (int64, bool) {
	for _, p := range paths {
		if n, ok := tokenCount(u.Get(p)); ok {
			return n, true
		}
	}
	return 0, false
}

// tokenCount reads v as a token count: a JSON number, or a string holding one (as some
// compatible servers and proxies write them: read as absent, an Anthropic-shaped report's cache
// writes went unbilled), clamped to [0, pricing.MaxTokens] so later arithmetic cannot overflow.
// A fraction rounds up, as every figure of a charge does: truncated, 0.9 tokens were none.
func tokenCount(v gjson.Result) (int64, bool) {
	if v.Type == gjson.String {
		s := strings.TrimSpace(v.Str)
		// Parse alone reads "n/a" as a number, so the string is checked for whole JSON first;
		// but not one that opens an array or an object, which is no count: gjson checks by
		// recursive descent, a stack frame per level, and a figure of 8 MiB of brackets (within
		// max_event_bytes, and max_response_bytes) took the stack past Go's 1 GB limit and
		// killed the process, every call in flight with it (as proxy's validJSON guards).
		if s == "" || s[0] == '[' || s[0] == '{' || !gjson.Valid(s) {
			return 0, false
		}
		v = gjson.Parse(s)
	}
	if v.Type != gjson.Number {
		return 0, false
	}
	n := v.Int()
	if v.Num < pricing.MaxTokens && float64(n) < v.Num { // exact below 2^53
		n++
	}
	return max(0, min(n, pricing.MaxTokens)), true
}

// largest returns the largest of the numbers at paths in u, and whether any holds one: for a
// figure a report may give under several names at once, each the whole count.
func largest(u gjson.Result, paths ...string) (n int64, ok bool) {
	for _, p := range paths {
		if v, seen := first(u, p); seen {
			n, ok = max(n, v), true
		}
	}
	return n, ok
}

// isError reports whether a top-level "error" value is a real error: providers send
// "error": null on healthy responses.
func isError(e gjson.Result) bool {
	switch e.Type {
	case gjson.Null, gjson.False:
		return false
	case gjson.String:
		return e.Str != ""
	}
	return e.Exists()
}

// chunksLen is the byte length of the text in a message's content given as a list of chunks, as Mistral's
// reasoning models answer (in a stream's delta too): "text" chunks, and "thinking" ones whose
// thinking is text or a list of text chunks. 0 for anything but a list. Read as a string alone,
// such an answer's words were none: a stream of them cut before its usage was charged no output.
func chunksLen(v gjson.Result) int64 {
	if !v.IsArray() {
		return 0
	}
	var n int64
	v.ForEach(func(_, c gjson.Result) bool {
		n += strLen(c.Get("text"))
		if th := c.Get("thinking"); th.IsArray() {
			th.ForEach(func(_, t gjson.Result) bool {
				n += strLen(t.Get("text"))
				return true
			})
		} else {
			n += strLen(th)
		}
		return true
	})
	return n
}

// strLen is the byte length of a JSON string value, 0 for anything else.
func strLen(v gjson.Result) int64 {
	if v.Type != gjson.String {
		return 0
	}
	return int64(len(v.Str))
}

// unsafeString views b as a string without copying: gjson parses strings, and copying every
// chunk would double the hot path's allocations. Only lengths and numbers are kept from the
// results, never the strings, so nothing outlives b.
func unsafeString(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
