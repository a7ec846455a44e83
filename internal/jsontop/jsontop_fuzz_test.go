package jsontop

import (
	"math"
	"testing"

	"github.com/tidwall/gjson"
)

// seeds are request bodies of every route (proxy's request seeds among them) and the shapes
// the index must read as gjson does: repeated keys, escaped keys, keys with dots, nesting.
var seeds = []string{
	`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"n":2}`,
	`{"model":"fake-gpt","messages":[{"role":"user","content":"a","content":"b"}]}`,
	`{"model":"fake-gpt","Model":"x","messages":[]}`,
	`{"model":"fake-gpt","input":[{"role":"user","content":[{"type":"input_text","text":"t"}]}],"conversation":{"id":"c"},"previous_response_id":"r","max_output_tokens":16}`,
	`{"model":"fake-claude","max_tokens":1024,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","TTL":null}}],"messages":[]}`,
	`{"model":"fake-gpt","a":{"b":1},"c":{"d":1,"\u0064":2},"e":[[{"x":{"t":1,"t":2}}]]}`,
	`{"model":"fake-gpt","m":"x\"y{\"a\":1,\"a\":2}","n":null,"stream":null,"models":["fake-gpt"]}`,
	`{"a":{"x":1},"a":{"b":2},"c":1,"c":{"b":3}}`,
	`{"mod\u0065l":"m","model":"n","a.b":{"c":1},"a":{"b.c":2},"text":{"format":{"type":"json"}}}`,
	`{"":{"":1},"x":{"":2},"providerOptions":{"gateway":{"models":["x"]}}}`,
}

// FuzzGet: for any JSON body and any path, Object.Get reads what gjson reads (Raw, Type, Str, Num,
// Exists). Besides the fuzzed path it reads every top-level key of the body and every key of
// a member object under it ("k", "k.", "k.j"): the plain paths the gateway reads, with the
// body's own keys (escaped, repeated, with dots) in them.
func FuzzGet(f *testing.F) {
	paths := []string{"model", "messages", "stream_options.include_usage", "a.b", "c.d", "text.format"}
	for i, b := range seeds {
		f.Add([]byte(b), paths[i%len(paths)])
	}
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		if !gjson.ValidBytes(body) {
			return // Index reads validated bodies only (see its comment)
		}
		root := gjson.ParseBytes(body)
		top := Index(root)
		check := func(p string) {
			got, want := top.Get(p), root.Get(p)
			if got.Raw != want.Raw || got.Type != want.Type || got.Str != want.Str ||
				math.Float64bits(got.Num) != math.Float64bits(want.Num) || got.Exists() != want.Exists() {
				t.Fatalf("%q: Get(%q) = %v %q, gjson reads %v %q", body, p, got.Type, got.Raw, want.Type, want.Raw)
			}
		}
		check(path)
		if !root.IsObject() {
			return
		}
		n := 0 // keys read, bounded: a body of many keys is no more to check than one of 64
		root.ForEach(func(k, v gjson.Result) bool {
			check(k.Str)
			check(k.Str + ".")
			v.ForEach(func(j, _ gjson.Result) bool {
				check(k.Str + "." + j.Str)
				n++
				return n < 64
			})
			n++
			return n < 64
		})
	})
}
