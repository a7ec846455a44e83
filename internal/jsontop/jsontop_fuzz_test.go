package jsontop

import (
	"fmt"
	"math"
	"strings"
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
	// Wider than fewMembers, so indexed by a map: a key repeated across the switch from the
	// slice ("a"), one repeated after it ("k20"), one met only after it ("last").
	wideObject(`"a":{"x":1},`, `"a":{"b":2},"k20":{"y":1},"k20":{"y":2,"z":3},"last":{"b":4}`),
	// fewMembers keys, then the first again: still a slice.
	fewWide(),
}

// wideObject is an object of head, then keys k1…k19, then tail.
func wideObject(head, tail string) string {
	var b strings.Builder
	b.WriteString("{" + head)
	for i := 1; i < 20; i++ {
		fmt.Fprintf(&b, `"k%d":{"v":%d},`, i, i)
	}
	return b.String() + tail + "}"
}

// fewWide is an object of fewMembers keys and one more that repeats the first.
func fewWide() string {
	var b strings.Builder
	b.WriteString(`{"a":{"x":1}`)
	for i := 1; i < fewMembers; i++ {
		fmt.Fprintf(&b, `,"k%d":%d`, i, i)
	}
	return b.String() + `,"a":{"b":2}}`
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

// TestIndexOfWideAndNarrowObjectsIsGjsons reads, of an object indexed by a map and of one at the
// slice's limit, every path the map's switch could get wrong: keys repeated across it, met
// only after it, and absent.
func TestIndexOfWideAndNarrowObjectsIsGjsons(t *testing.T) {
	wide := wideObject(`"a":{"x":1},`, `"a":{"b":2},"k20":{"y":1},"k20":{"y":2,"z":3},"last":{"b":4}`)
	narrow := fewWide()
	if top := Index(gjson.Parse(wide)); top.many == nil {
		t.Fatalf("%d-member object not indexed by a map", len(top.few))
	}
	if top := Index(gjson.Parse(narrow)); top.many != nil || len(top.few) != fewMembers {
		t.Fatalf("object of %d keys and a repeat: few %d, map %v", fewMembers, len(top.few), top.many != nil)
	}
	paths := []string{"a", "a.x", "a.b", "k1.v", "k16.v", "k17.v", "k19.v", "k20", "k20.y", "k20.z", "last", "last.b", "absent", "absent.b", "k14"}
	for _, body := range []string{wide, narrow} {
		root := gjson.Parse(body)
		top := Index(root)
		for _, p := range paths {
			if got, want := top.Get(p), root.Get(p); got.Raw != want.Raw || got.Exists() != want.Exists() {
				t.Errorf("%s: Get(%q) = %q, gjson reads %q", body, p, got.Raw, want.Raw)
			}
		}
	}
}

// BenchmarkIndexAndRead is a chat request's index and the lookups its checks make, most of them
// for keys the request lacks.
func BenchmarkIndexAndRead(b *testing.B) {
	root := gjson.Parse(`{"model":"fake-gpt","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}],` +
		`"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":256,"temperature":0.2,"user":"u-1"}`)
	keys := []string{"model", "messages", "stream", "stream_options.include_usage", "max_tokens", "max_completion_tokens", "n",
		"tools", "functions", "response_format", "text.format", "audio", "modalities", "prediction", "reasoning_effort",
		"service_tier", "store", "metadata", "logprobs", "top_logprobs", "web_search_options", "parallel_tool_calls",
		"thinking", "system", "input", "instructions", "previous_response_id", "conversation", "background", "prompt"}
	b.ReportAllocs()
	for b.Loop() {
		top := Index(root)
		for _, k := range keys {
			_ = top.Get(k)
		}
	}
}
