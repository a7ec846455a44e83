package proxy

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/jsontop"
	"github.com/tollgate/tollgate/metering"
)

// The body's keys read once: no key the gateway reads repeated or spelt in another case, and no
// nesting deeper than the validation may face.

// checkRepeatsAnywhere refuses a body that repeats a key anywhere: below the top level, as at
// it (checkReadKeysOnce), what the prompt's estimate reads (the charge of a call whose usage
// never comes, the output bound within the cap) must be what the provider bills. Checked last,
// so that a body refused for what a repeat hid (an option billed at other rates) is told so.
func checkRepeatsAnywhere(format metering.Format, root topObject) *apiError {
	if k, ok := repeatedKeyAnywhere(root.Raw); ok {
		return errBadRequest("invalid_json", fmt.Sprintf("The request body repeats the key %q.", quotedValue(k)))
	}
	if k := repeatedPromptKey(format, root); k != "" {
		return errRepeatedKey(k)
	}
	return nil
}

// readKeys are the top-level keys parseCall reads, across every route: the model and stream
// mode, the output bounds, the options billed at other rates (unpricedOption: service_tier,
// Anthropic's premium "speed" and "inference_geo", Bedrock's "performanceConfig" and
// "serviceTier" as LiteLLM passes them on, audio, hosted tools), a router's fallback
// lists ("models", LiteLLM's "fallbacks": checkFallbacks) and provider preferences ("provider":
// routerProviderSort), "prompt", whose batch multiplies a
// completions call's answers, and every part of the prompt its estimate reads
// (metering.EstimatePrompt): "messages" and "input", a system prompt, instructions, an output
// schema, legacy function definitions, a completion's suffix. Under "messages" and "input" the
// audio refusal also looks for input_audio parts, and one in another case alone would carry
// them past it to a provider that folds keys.
//
// The keys read to refuse a call (unpricedOption, routerRetryField, serverNativeField) are among
// them: OpenRouter's "plugins", Vercel's "providerOptions", the body's "context-1m" beta,
// LiteLLM's timeouts and retries and its "extra_body", llama.cpp's "n_predict". Spelt in
// another case, a provider or relay that folds keys ran what the gateway, reading the exact
// spelling, never refused ("Plugins": a web search charged as tokens alone).
var readKeys = append(append([]string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens",
	"n", "best_of", "background", "service_tier", "web_search_options", "audio", "modalities", "tools", "messages", "input",
	"previous_response_id", "conversation", "prompt", "speed", "inference_geo", "models",
	"system", "instructions", "response_format", "text", "functions", "suffix", "fallbacks", "provider",
	"plugins", "providerOptions", "anthropic_beta", "additionalModelRequestFields", "tags",
	"performanceConfig", "serviceTier", "preset", "extra_body"}, routerRetryFields...), serverNativeFields...)

// nestedReadKeys are the keys the gateway reads inside a top-level object, checked as readKeys
// are.
var nestedReadKeys = []struct{ parent, key string }{
	{"stream_options", "include_usage"},                // whether the usage comes
	{"text", "format"},                                 // the Responses output schema, part of the prompt's estimate
	{"prompt", "variables"},                            // a stored prompt's variables, part of the prompt's estimate
	{"conversation", "id"},                             // the conversation whose context the estimate counts (continuedFrom)
	{"provider", "sort"},                               // a router's provider order, refused unless by price (routerProviderSort)
	{"providerOptions", "gateway"},                     // Vercel's fallback list and provider order
	{"additionalModelRequestFields", "anthropic_beta"}, // the context-1m beta, as Bedrock's Converse takes it
	{"providerOptions.gateway", "speed"},               // Vercel's fast mode (unpricedOption)
	{"performanceConfig", "latency"},                   // Bedrock's latency-optimized inference, through LiteLLM
	{"serviceTier", "type"},                            // Bedrock's service tier, through LiteLLM
}

// checkReadKeysOnce refuses a body that repeats a key the gateway reads at its top level
// (readKeys) or inside one of its objects (nestedReadKeys). The gateway reads the first of
// repeated keys (gjson), providers the last: a body that names one model, stream mode, output
// bound or usage option to the gateway and another to the provider would be billed for what
// it did not run.
func checkReadKeysOnce(root topObject) *apiError {
	if k, ok := repeatedKey(root.Result, readKeys...); ok {
		return errRepeatedKey(k)
	}
	for _, n := range nestedReadKeys {
		if obj := root.Get(n.parent); obj.IsObject() {
			if k, ok := repeatedKey(obj, n.key); ok {
				return errRepeatedKey(n.parent + "." + k)
			}
		}
	}
	return nil
}

// errRepeatedKey refuses a body whose key k, with case folded, repeats a key or spells one the
// gateway reads (repeatedKey, repeatedPromptKey): one wording for a call and a token count.
func errRepeatedKey(k string) *apiError {
	return errBadRequest("invalid_json", fmt.Sprintf("The request body repeats the key %q (keys are compared with case folded).", quotedValue(k)))
}

// repeatedKey returns a key that obj holds more than once, or one that is a misspelling of a
// key in read (the keys the gateway reads), and whether there is one: the key found may be
// "" (an empty key is a key; read as "no repeat", a repeated one hid every repeat after it, a
// second "model" among them). Keys are compared unescaped and with case
// folded as Go's encoding/json matches them to fields ("Model", "MODEL", "ſtream" with
// U+017F): a provider decoding with it reads "model" and "Model" as one key (the last), and
// "Stream" alone as "stream", which the gateway would not see.
func repeatedKey(obj gjson.Result, read ...string) (string, bool) {
	return repeatedKeyEach(obj.Raw, read, nil)
}

// repeatedKeyEach is repeatedKey on the raw JSON of an object that also hands each member it
// passed to each (nil: none), so that a caller reads the values it wants in the same pass.
// When no repeat is found, each has seen every member, and each key once: exact repeats too
// are repeats.
//
// The first keysBeforeSet keys are compared one by one as they come; an object with more is
// checked once it has been read, its keys sorted with case folded (compareFolded), as
// repeatedKeyAnywhere does. Kept in a set of folded copies, a 4 MiB object of 400 000 short
// keys took some 50 MiB as it was read, before anything was held.
func repeatedKeyEach(raw string, read []string, each func(key, value string)) (string, bool) {
	var (
		few  [keysBeforeSet]string // the keys seen, until there are more
		n    int
		many []string // then every key, views of raw (or unescaped copies)
		dup  string
	)
	found := false
	jsontop.Members(raw, func(k, v string) bool {
		if many == nil && seenFolded(k, few[:n]) {
			dup, found = k, true
			return false
		}
		for _, r := range read {
			if k != r && strings.EqualFold(k, r) {
				dup, found = k, true
				return false
			}
		}
		switch {
		case many != nil:
			many = appendDoubling(many, k)
		case n < len(few):
			few[n] = k
			n++
		default:
			many = append(append(make([]string, 0, 4*keysBeforeSet), few[:]...), k)
		}
		if each != nil {
			each(k, v)
		}
		return true
	})
	if !found && many != nil {
		dup, found = repeatedSorted(many, compareFolded)
	}
	return dup, found
}

// repeatedSorted sorts keys by cmp and returns one that cmp finds equal to another: the later
// of the two in keys' order (the sort is stable), as a check of each key as it comes would name.
func repeatedSorted(keys []string, cmp func(a, b string) int) (string, bool) {
	slices.SortStableFunc(keys, cmp)
	for i := 1; i < len(keys); i++ {
		if cmp(keys[i-1], keys[i]) == 0 {
			return keys[i], true
		}
	}
	return "", false
}

// appendDoubling appends k to keys, doubling their room when it runs out: append grows a
// large slice by a quarter, which for the 400 000 keys of a 4 MiB object allocated five times
// their final size as they came.
func appendDoubling(keys []string, k string) []string {
	if len(keys) == cap(keys) {
		keys = slices.Grow(keys, max(len(keys), keysBeforeSet))
	}
	return append(keys, k)
}

// seenFolded reports whether k, with case folded, is among few.
func seenFolded(k string, few []string) bool {
	for _, s := range few {
		if strings.EqualFold(s, k) {
			return true
		}
	}
	return false
}

// compareFolded orders keys as their foldKey, equal exactly when strings.EqualFold(a, b), and
// without a copy of either when both are ASCII (as a request's keys are).
func compareFolded(a, b string) int {
	if !isASCII(a) || !isASCII(b) {
		return strings.Compare(foldKey(a), foldKey(b))
	}
	for i := 0; i < min(len(a), len(b)); i++ {
		if x, y := upperASCII(a[i]), upperASCII(b[i]); x != y {
			return int(x) - int(y)
		}
	}
	return len(a) - len(b)
}

// isASCII reports whether s holds ASCII bytes alone.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// upperASCII is c in upper case when it is an ASCII letter, else c.
func upperASCII(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// foldKey maps every rune of s to the smallest of its simple case folding orbit, so that
// foldKey(a) == foldKey(b) exactly when strings.EqualFold(a, b).
func foldKey(s string) string {
	if isASCII(s) {
		// Every ASCII letter's orbit has its upper case as smallest ('k' and 's' too: U+212A
		// and U+017F are larger).
		return strings.ToUpper(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b.WriteRune(m)
	}
	return b.String()
}

// maxJSONDepth is the deepest nesting of objects and arrays a body may have: encoding/json's
// own limit, far beyond any real request (tool schemas included).
const maxJSONDepth = 10000

// nestedDeeperThan reports whether b opens more than limit objects or arrays at once, outside
// strings. It does not validate; it only bounds what the recursive validation will face.
func nestedDeeperThan(b []byte, limit int) bool {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > limit {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}
