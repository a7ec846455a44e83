// Package jsontop indexes a JSON object's top level, for code that reads many of its keys.
package jsontop

import (
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Object is a JSON object with its top-level members indexed by key. A request's checks
// (proxy's parseCall) and its prompt's estimate (metering) read dozens of top-level fields,
// most of them absent from a given request, and gjson finds an absent key only by skipping
// every member of the object: as many passes over the body as there were lookups (about 60 %
// of the CPU of a 200 KB agent body's checks, a 4 MB image's alike). The index is one pass,
// and a lookup after it reads only the member it names.
type Object struct {
	gjson.Result
	members map[string]member
}

type member struct {
	value gjson.Result
	// repeated: the key occurs again. gjson, reading a path through a repeated key, goes on to
	// the next occurrence when the first lacks the rest of the path; such a lookup is left to
	// it, so that every result is gjson's.
	repeated bool
}

// Index indexes root, a JSON object, by its keys as gjson compares them (unescaped). Anything
// else (an array, a scalar) is not indexed: gjson reads it as it would.
func Index(root gjson.Result) Object {
	if !root.IsObject() {
		return Object{Result: root}
	}
	t := Object{Result: root, members: make(map[string]member, 16)}
	root.ForEach(func(k, v gjson.Result) bool {
		if m, ok := t.members[k.Str]; ok {
			m.repeated = true
			t.members[k.Str] = m
		} else {
			t.members[k.Str] = member{value: v}
		}
		return true
	})
	return t
}

// Get is gjson.Result.Get on the object, for the plain paths the gateway reads ("a", "a.b");
// a path with gjson's syntax in it (wildcards, escapes, queries, modifiers, pipes) is gjson's
// to read.
func (t Object) Get(path string) gjson.Result {
	if t.members == nil || strings.ContainsAny(path, `|#*?\@!{[:=`) {
		return t.Result.Get(path)
	}
	key, rest, nested := strings.Cut(path, ".")
	m, ok := t.members[key]
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

// View is b as a string without a copy, for gjson to read. The caller must not change b while
// the string or anything read from it is in use: a request body, read whole and never edited
// in place (the rewrite makes a new one), qualifies.
func View(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
