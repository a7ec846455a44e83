package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate/tollgate/config"
)

// requestSeeds are request bodies for every route, with the shapes the parser reads: bounds,
// choices, repeats and case variants, cache marks, audio, nesting.
var requestSeeds = []string{
	`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"n":2}`,
	`{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`,
	`{"model":"fake-gpt","messages":[{"role":"user","content":"a","content":"b"}]}`,
	`{"model":"fake-gpt","Model":"x","messages":[]}`,
	`{"model":"fake-gpt","prompt":["a","b",[1,2]],"best_of":3,"max_tokens":5}`,
	`{"model":"fake-gpt","input":[{"role":"user","content":[{"type":"input_text","text":"t"}]}],"conversation":{"id":"c"},"previous_response_id":"r","max_output_tokens":16}`,
	`{"model":"fake-claude","max_tokens":1024,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","TTL":null}}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}]}`,
	`{"model":"fake-gpt","a":{"b":1},"c":{"d":1,"\u0064":2},"e":[[{"x":{"t":1,"t":2}}]]}`,
	`{"model":"fake-gpt","m":"x\"y{\"a\":1,\"a\":2}","n":null,"stream":null,"models":["fake-gpt"]}`,
	`{"model":"fake-gpt","k":[[[[[[[[[[[[[[[[{"cache_control":{"ttl":5}}]]]]]]]]]]]]]]]]}`,
}

// fuzzServer is a Server with just what parseCall reads: the default configuration's priced
// model served by an OpenAI upstream, and a priced Anthropic one.
func fuzzServer(tb testing.TB) *Server {
	tb.Helper()
	cfg := config.Default()
	cfg.Models["fake-claude"] = cfg.Models["fake-gpt"]
	cfg.Upstreams = append(cfg.Upstreams, config.Upstream{Name: "a", Kind: "anthropic", BaseURL: "http://127.0.0.1:9", Models: []string{"fake-claude"}})
	prices, err := cfg.PriceTable()
	if err != nil {
		tb.Fatal(err)
	}
	return &Server{cfg: cfg, prices: prices}
}

// providerView is what a provider decoding with Go's encoding/json reads of the fields the
// gateway bills by.
type providerView struct {
	Model               *string      `json:"model"`
	Stream              *bool        `json:"stream"`
	MaxTokens           *json.Number `json:"max_tokens"`
	MaxCompletionTokens *json.Number `json:"max_completion_tokens"`
	MaxOutputTokens     *json.Number `json:"max_output_tokens"`
}

// FuzzParseCall parses any body on every route: it never panics, and a body it accepts is
// JSON by encoding/json's reading too, in which a provider reads the model, stream mode and
// output bounds the gateway read, with estimates inside their bounds.
func FuzzParseCall(f *testing.F) {
	for i, b := range requestSeeds {
		f.Add([]byte(b), uint8(i))
	}
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		rt := routes[int(which)%len(routes)]
		c, aerr := s.parseCall(rt, body, http.Header{})
		if aerr != nil {
			if c != nil {
				t.Fatalf("refused (%s) with a call", aerr.Code)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted a body encoding/json does not read as JSON: %q", body)
		}
		var pv providerView
		if err := json.Unmarshal(body, &pv); err != nil {
			// A field of the wrong type is skipped, the rest decoded; the gateway refuses one
			// of the wrong type among those it reads on the route, not the others.
			var te *json.UnmarshalTypeError
			if !errors.As(err, &te) {
				t.Fatalf("accepted a body encoding/json cannot decode: %v", err)
			}
			if te.Field == "model" || te.Field == "stream" || slices.Contains(rt.maxFields, te.Field) {
				t.Fatalf("accepted a body whose %s a provider cannot read: %v", te.Field, err)
			}
		}
		if pv.Model == nil || *pv.Model != c.model {
			t.Fatalf("the gateway reads model %q, a provider %v", c.model, pv.Model)
		}
		if got := pv.Stream != nil && *pv.Stream; got != c.stream {
			t.Fatalf("the gateway reads stream %v, a provider %v", c.stream, got)
		}
		provider := map[string]*json.Number{"max_tokens": pv.MaxTokens, "max_completion_tokens": pv.MaxCompletionTokens, "max_output_tokens": pv.MaxOutputTokens}
		for i, fld := range rt.maxFields {
			n := provider[fld]
			if (n == nil) != (c.bounds[i] < 0) || (n != nil && n.String() != strconv.FormatInt(c.bounds[i], 10)) {
				t.Fatalf("the gateway reads %s %d, a provider %v", fld, c.bounds[i], n)
			}
		}
		if c.inputEstimate < 0 || c.audioEstimate < 0 || c.choices < 1 || (c.maxOutput != -1 && c.maxOutput < 1) {
			t.Fatalf("estimate %d, audio %d, choices %d, bound %d", c.inputEstimate, c.audioEstimate, c.choices, c.maxOutput)
		}
		if u := c.promptEstimate(); u != u.Clamp() {
			t.Fatalf("prompt estimate %+v is not clamped", u)
		}
	})
}

// refRepeatedKey is repeatedKeyAnywhere the slow, obvious way: encoding/json's tokens, a set
// of keys per open object, the path built from the open objects' keys and arrays.
func refRepeatedKey(raw []byte) (string, bool, error) {
	type frame struct {
		object  bool
		keys    map[string]bool
		key     string
		wantKey bool
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.object {
					top.wantKey = true
				}
				stack = append(stack, &frame{object: v == '{', keys: map[string]bool{}, wantKey: v == '{'})
				continue
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantKey = true
				}
				continue
			}
		case string:
			if top != nil && top.object && top.wantKey {
				top.wantKey = false
				if top.keys[v] {
					path := ""
					for _, o := range stack[:len(stack)-1] {
						if o.object {
							path += o.key + "."
						} else {
							path = strings.TrimSuffix(path, ".") + "[]."
						}
					}
					return path + v, true, nil
				}
				top.keys[v] = true
				top.key = v
				continue
			}
		}
		if top != nil && top.object {
			top.wantKey = true
		}
	}
}

// refCacheControls is cacheControls the slow, obvious way: decoded by encoding/json, any
// object that is the value of a key equal to "cache_control" with case folded marks the
// prompt, and a "ttl" of it (case folded) other than "5m" or null asks for the long cache.
func refCacheControls(v any, underCC bool) (marked, long bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			isCC := strings.EqualFold(k, "cache_control")
			if _, obj := x.(map[string]any); isCC && obj {
				marked = true
			}
			if underCC && strings.EqualFold(k, "ttl") && x != nil && x != "5m" {
				long = true
			}
			m, l := refCacheControls(x, isCC)
			marked, long = marked || m, long || l
		}
	case []any:
		for _, x := range v {
			m, l := refCacheControls(x, false)
			marked, long = marked || m, long || l
		}
	}
	return marked, long
}

// FuzzRepeatedKeys checks the one-pass scans of a body parseObject accepts (the repeated-key
// scan, the cache marks) against slow references built on encoding/json.
func FuzzRepeatedKeys(f *testing.F) {
	for _, b := range requestSeeds {
		f.Add([]byte(b))
	}
	f.Add([]byte(`{"a":{"k":1,"K":2},"b":[{"x":1},{"x":1}],"\u00e9":1,"é":2}`))
	f.Add([]byte(`{"s":"\\","t":"\"","u":{"":1,"":2}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		root, aerr := parseObject(body)
		if aerr != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("parseObject accepted a body encoding/json does not read as JSON: %q", body)
		}
		got, found := repeatedKeyAnywhere(root.Raw)
		gotMarked, gotLong := cacheControls(root.Raw)
		if !utf8.Valid(body) {
			// encoding/json reads each byte that is not UTF-8 as U+FFFD, the scans compare
			// keys byte for byte: keys that differ only there are none the gateway reads.
			return
		}
		want, wantFound, err := refRepeatedKey(body)
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		if got != want || found != wantFound {
			t.Fatalf("repeatedKeyAnywhere = %q, %v; reference %q, %v, in %q", got, found, want, wantFound, body)
		}
		if found {
			return // encoding/json keeps the last of a repeat: the cache marks' reference cannot see the first
		}
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("decode: %v", err)
		}
		wm, wl := refCacheControls(v, false)
		if gotMarked != wm || gotLong != wl {
			t.Fatalf("cacheControls = %v, %v; reference %v, %v, in %q", gotMarked, gotLong, wm, wl, body)
		}
	})
}
