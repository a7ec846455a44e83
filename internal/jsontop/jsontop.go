// Package jsontop indexes a JSON object's top level, for code that reads many of its keys.
package jsontop

import (
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Object is a JSON object with its top-level members indexed by key. A request's checks
// (proxy's parseCall) and its prompt's estimate (metering) read dozens of top-level fields,
// most of them absent from a given request, and gjson finds an absent key only by skipping
// every member of the object: as many passes over the body as there were lookups (about 60 %
// of the CPU of a 200 KB agent body's checks, a 4 MB image's alike). The index is one pass,
// and a lookup after it reads only the member it names.
//
// A request has a handful of top-level keys, so they are kept in a slice searched in order: a
// map sized for them was one sixth of all the bytes a hot user's calls allocated (two indexes
// a call, 3.5 KB each), and a short scan of short keys is as quick as hashing. An object wider
// than fewMembers is indexed by a map, so that no body can make each lookup a long scan.
type Object struct {
	gjson.Result
	few  []member          // the members in order, when there are at most fewMembers
	many map[string]member // the members by key, when there are more
}

// fewMembers is the widest object indexed by a slice; past it the scans of a request's 60-odd
// lookups would cost more than a map's hashing.
const fewMembers = 16

type member struct {
	key   string
	value gjson.Result
	// repeated: the key occurs again. gjson, reading a path through a repeated key, goes on to
	// the next occurrence when the first lacks the rest of the path; such a lookup is left to
	// it, so that every result is gjson's.
	repeated bool
}

// Index indexes root, a JSON object, by its keys as gjson compares them (unescaped). Anything
// else (an array, a scalar) is not indexed: gjson reads it as it would. root must be valid
// JSON (a request body is, parseObject checked it): of a malformed one gjson's lookups and
// its ForEach, which the index is built with, may read different members.
func Index(root gjson.Result) Object {
	if !root.IsObject() {
		return Object{Result: root}
	}
	t := Object{Result: root, few: make([]member, 0, 8)}
	root.ForEach(func(k, v gjson.Result) bool {
		t.add(k.Str, v)
		return true
	})
	return t
}

// Get is gjson.Result.Get on the object, for the plain paths the gateway reads ("a", "a.b");
// a path with gjson's syntax in it (wildcards, escapes, queries, modifiers, pipes, a leading
// ".." that reads the body as JSON lines) is gjson's to read.
func (t Object) Get(path string) gjson.Result {
	if !t.indexed() || strings.ContainsAny(path, `|#*?\@!{[:=`) || strings.HasPrefix(path, "..") {
		return t.Result.Get(path)
	}
	key, rest, nested := strings.Cut(path, ".")
	m, ok := t.find(key)
	switch {
	case !ok:
		return gjson.Result{}
	case m.repeated:
		return t.Result.Get(path)
	case !nested:
		return m.value
	}
	return m.value.Get(rest)
}

// add indexes one member; a key met again marks the first occurrence repeated.
func (t *Object) add(key string, value gjson.Result) {
	if t.many != nil {
		if m, ok := t.many[key]; ok {
			m.repeated = true
			t.many[key] = m
			return
		}
		t.many[key] = member{key: key, value: value}
		return
	}
	for i := range t.few {
		if t.few[i].key == key {
			t.few[i].repeated = true
			return
		}
	}
	if len(t.few) < fewMembers {
		t.few = append(t.few, member{key: key, value: value})
		return
	}
	t.many = make(map[string]member, 2*fewMembers)
	for _, m := range t.few {
		t.many[m.key] = m
	}
	t.few = nil
	t.many[key] = member{key: key, value: value}
}

// indexed reports whether Index indexed the object (it was one).
func (t Object) indexed() bool {
	return t.few != nil || t.many != nil
}

// find returns the first member named key.
func (t Object) find(key string) (member, bool) {
	if t.many != nil {
		m, ok := t.many[key]
		return m, ok
	}
	for _, m := range t.few {
		if m.key == key {
			return m, true
		}
	}
	return member{}, false
}

// View is b as a string without a copy, for gjson to read. The caller must not change b while
// the string or anything read from it is in use: a request body, read whole and never edited
// in place (the rewrite makes a new one), qualifies.
func View(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// Members calls fn with each member of the JSON object raw, in order, until fn returns false:
// its key unescaped (as gjson compares keys) and its value's raw JSON. raw must be valid JSON
// (the gateway checks a body before it reads it); anything but an object has no members, and
// malformed bytes end the walk. The values are only skipped: gjson's ForEach unescapes every
// string value it passes, and the checks that read only a message's keys spent most of their
// time unescaping the tool outputs of an agent's transcript.
func Members(raw string, fn func(key, value string) bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return
	}
	for i = skipSpace(raw, i+1); i < len(raw) && raw[i] == '"'; i = skipSpace(raw, i+1) {
		end, escaped := stringEnd(raw, i)
		if end >= len(raw) {
			return
		}
		key := raw[i+1 : end]
		if escaped {
			key = gjson.Parse(raw[i : end+1]).Str
		}
		i = skipSpace(raw, end+1)
		if i >= len(raw) || raw[i] != ':' {
			return
		}
		start := skipSpace(raw, i+1)
		i = valueEnd(raw, start)
		if i > len(raw) || !fn(key, raw[start:i]) {
			return
		}
		if i = skipSpace(raw, i); i >= len(raw) || raw[i] != ',' {
			return
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not JSON whitespace.
func skipSpace(raw string, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index of the quote closing the string that opens at i (len(raw) if
// none does), and whether the string has an escape in it.
func stringEnd(raw string, i int) (end int, escaped bool) {
	for end = i + 1; end < len(raw) && raw[end] != '"'; end++ {
		if raw[end] == '\\' {
			end++
			escaped = true
		}
	}
	return min(end, len(raw)), escaped
}

// valueEnd returns the index just past the JSON value that starts at i (past len(raw) if it
// does not end).
func valueEnd(raw string, i int) int {
	if i >= len(raw) {
		return len(raw) + 1
	}
	switch raw[i] {
	case '"':
		end, _ := stringEnd(raw, i)
		return end + 1
	case '{', '[':
		depth := 0
		for ; i < len(raw); i++ {
			switch raw[i] {
			case '"':
				i, _ = stringEnd(raw, i)
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(raw) + 1
	}
	for i < len(raw) && !strings.ContainsRune(",}] \t\r\n", rune(raw[i])) {
		i++
	}
	return i
}

// UnescapedLen is len(gjson.Parse(raw).Str) for raw, a valid JSON string (quotes included),
// without unescaping it: a prompt's estimate counts the bytes of long texts (tool outputs,
// documents) and keeps none of them. 0 for anything that is no string.
func UnescapedLen(raw string) int {
	if raw == "" || raw[0] != '"' {
		return 0
	}
	end, _ := stringEnd(raw, 0)
	s := raw[1:end]
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			n++
			continue
		}
		if i++; i >= len(s) {
			break
		}
		if s[i] != 'u' {
			n++ // \n, \", \\ and their kin are one byte each
			continue
		}
		// As gjson decodes \uXXXX: a high surrogate followed by an escaped low one is one
		// rune, any other surrogate the replacement character (three bytes).
		if i+5 > len(s) {
			break
		}
		r := hexRune(s[i+1 : i+5])
		i += 4
		if r >= 0xD800 && r < 0xDC00 && i+7 <= len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
			if r2 := hexRune(s[i+3 : i+7]); r2 >= 0xDC00 && r2 < 0xE000 {
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
		}
		if l := utf8.RuneLen(r); l > 0 {
			n += l
		} else {
			n += len(string(utf8.RuneError))
		}
	}
	return n
}

// hexRune reads four hex digits (valid JSON has nothing else after \u).
func hexRune(h string) rune {
	var r rune
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
