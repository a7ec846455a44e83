package proxy

import (
	"testing"

	"github.com/tidwall/gjson"
)

// topObject.Get reads what gjson reads, repeated keys, escaped keys and gjson's path syntax
// included.
func TestTopObjectGetIsGjsons(t *testing.T) {
	bodies := append([]string{
		`{"a":{"x":1},"a":{"b":2},"c":1,"c":{"b":3}}`,
		`{"mod\u0065l":"m","stream_options":{"include_usage":true},"text":{"format":{"type":"json"}},"tools":[{"type":"web_search"}]}`,
		`{"providerOptions":{"gateway":{"models":["x"]}},"":1,"a.b":2,"plugins":[{"id":"web"}]}`,
		`{}`, `[{"a":1}]`, `"a"`, ` {"a":1}`,
	}, requestSeeds...)
	paths := []string{"a", "a.b", "c.b", "model", "stream_options.include_usage", "text.format", "tools", "tools.#",
		"providerOptions.gateway.models", "plugins", "", "a\\.b", "m*", "missing", "missing.x", "n", "prompt.variables", "conversation.id"}
	for _, body := range bodies {
		root := gjson.Parse(body)
		top := indexTop(root)
		for _, p := range paths {
			got, want := top.Get(p), root.Get(p)
			if got.Raw != want.Raw || got.Type != want.Type || got.Str != want.Str || got.Exists() != want.Exists() {
				t.Errorf("%s: Get(%q) = %q, gjson reads %q", body, p, got.Raw, want.Raw)
			}
		}
	}
}
