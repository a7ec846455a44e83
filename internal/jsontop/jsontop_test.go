package jsontop

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// membersSeeds are objects with what Members must walk past: escapes in keys and in strings
// (an escaped quote, an escaped backslash before a closing quote), nesting, brackets inside
// strings, every scalar, whitespace, repeated keys; and values that are no object.
var membersSeeds = []string{
	`{"a":1,"b":"x","c":{"d":[1,2,{"e":"}"}]},"f":true,"g":null,"h":-1.5e3}`,
	`{"mod\u0065l":"m","k\"q":"v\\","s":"a\"b\\\"c]}","":[],"t":[[]],"u":{}}`,
	" { \"a\" : \"x\" ,\n\t\"a\" : [ 1 , 2 ] , \"b\":false } ",
	`{"content":"\n\"quoted\"\u00e9\ud83d\ude00","tool_calls":[{"function":{"arguments":"{\"a\":1}"}}]}`,
	`{}`, `[{"a":1}]`, `"a"`, `1`, `null`, ``,
}

// TestMembersIsGjsonsForEach: Members hands over each member of an object as gjson's ForEach
// does, its key unescaped and its value's raw bytes, and nothing for anything else.
func TestMembersIsGjsonsForEach(t *testing.T) {
	for _, raw := range membersSeeds {
		checkMembers(t, raw)
	}
}

// FuzzMembers is TestMembersIsGjsonsForEach on any valid JSON; on any other bytes Members
// ends without a panic and hands over only values that are slices of the bytes.
func FuzzMembers(f *testing.F) {
	for _, raw := range membersSeeds {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !gjson.Valid(raw) {
			Members(raw, func(_, v string) bool {
				if !strings.Contains(raw, v) {
					t.Fatalf("%q: value %q is not in the bytes", raw, v)
				}
				return true
			})
			return
		}
		checkMembers(t, raw)
	})
}

func checkMembers(t *testing.T, raw string) {
	t.Helper()
	type kv struct{ key, value string }
	var got, want []kv
	Members(raw, func(k, v string) bool {
		got = append(got, kv{k, v})
		return true
	})
	if root := gjson.Parse(raw); root.IsObject() {
		root.ForEach(func(k, v gjson.Result) bool {
			want = append(want, kv{k.Str, v.Raw})
			return true
		})
	}
	if len(got) != len(want) {
		t.Fatalf("%s: Members gave %q, gjson %q", raw, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: member %d is %q, gjson reads %q", raw, i, got[i], want[i])
		}
	}
	// Stopping: fn returning false ends the walk at once.
	calls := 0
	Members(raw, func(string, string) bool {
		calls++
		return false
	})
	if calls > 1 {
		t.Fatalf("%s: Members went on after fn returned false (%d calls)", raw, calls)
	}
}

// unescapedSeeds are JSON strings with every escape, surrogate pairs, lone and misordered
// surrogates, and upper- and lower-case hex.
var unescapedSeeds = []string{
	`""`, `"plain"`, `"\n\t\r\b\f\/\\\""`, `"\u00e9\u4E2D"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`,
	`"\ude00\ud83d"`, `"\ud83d\u0041"`, `"\ud83d\\ude00"`, `"é😀"`, `"a\u0000b"`,
}

// TestUnescapedLenIsGjsons: UnescapedLen is the length of the string gjson unescapes.
func TestUnescapedLenIsGjsons(t *testing.T) {
	for _, raw := range unescapedSeeds {
		checkUnescapedLen(t, raw)
	}
	for _, raw := range []string{``, `1`, `{"a":"b"}`, `"`} {
		if n := UnescapedLen(raw); n != 0 {
			t.Errorf("UnescapedLen(%s) = %d, want 0 for no string", raw, n)
		}
	}
}

// FuzzUnescapedLen is TestUnescapedLenIsGjsons on any valid JSON string.
func FuzzUnescapedLen(f *testing.F) {
	for _, raw := range unescapedSeeds {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !gjson.Valid(raw) || !strings.HasPrefix(raw, `"`) {
			UnescapedLen(raw) // no panic on any bytes
			return
		}
		checkUnescapedLen(t, raw)
	})
}

func checkUnescapedLen(t *testing.T, raw string) {
	t.Helper()
	if got, want := UnescapedLen(raw), len(gjson.Parse(raw).Str); got != want {
		t.Fatalf("UnescapedLen(%s) = %d, gjson unescapes %d bytes", raw, got, want)
	}
}
