package fakellm

import (
	"fmt"
	"math"

	"github.com/tidwall/gjson"
)

// PromptTokens is the fake's tokenizer: a rule simple enough that a test can
// state the expected bill without running a real tokenizer, and close enough to
// real ones (about 4 bytes a token, a few tokens of overhead per message) that
// demo numbers look plausible.
//
//	prompt_tokens = ceil(B / 4) + 4 × M
//
// M counts the messages of the request, B the UTF-8 bytes (after JSON
// unescaping) of their text. One body shape serves every route, so the rule
// reads whichever of these top-level fields is present:
//
//   - messages[]: one message each; its content is a string, or an array of
//     parts whose "text" strings count (images and other parts count 0 bytes);
//   - system (Anthropic), instructions (Responses): one message, string or text parts;
//   - input (Responses, embeddings), prompt (legacy completions): a string is one
//     message; in an array each string, and each object with its "content", is
//     one message; numbers (token ids) count nothing.
//
// The result is meaningless for a body that is not valid JSON; the server
// rejects those before counting.
func PromptTokens(body []byte) int64 {
	var bytes, msgs int64
	one := func(n int) { bytes += int64(n); msgs++ }
	gjson.ParseBytes(body).ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "messages":
			v.ForEach(func(_, m gjson.Result) bool {
				one(textBytes(m.Get("content")))
				return true
			})
		case "system", "instructions":
			if v.Type != gjson.Null {
				one(textBytes(v))
			}
		case "input", "prompt":
			if v.IsArray() {
				v.ForEach(func(_, item gjson.Result) bool {
					switch {
					case item.Type == gjson.String:
						one(len(item.Str))
					case item.IsObject():
						one(textBytes(item.Get("content")))
					}
					return true
				})
			} else if v.Type == gjson.String {
				one(len(v.Str))
			}
		}
		return true
	})
	return (bytes+3)/4 + 4*msgs
}

// textBytes counts the text of a content field: a string, or parts with "text".
func textBytes(c gjson.Result) int {
	switch {
	case c.Type == gjson.String:
		return len(c.Str)
	case c.IsArray():
		n := 0
		c.ForEach(func(_, part gjson.Result) bool {
			if part.Type == gjson.String {
				n += len(part.Str)
			} else if t := part.Get("text"); t.Type == gjson.String {
				n += len(t.Str)
			}
			return true
		})
		return n
	}
	return 0
}

// CompletionTokens is the output of an answer: one token per chunk, never more
// than the request's limit, because a gateway that caps max_tokens must be able
// to trust that the upstream stays under it. chunks is the effective count
// (X-Fake-Chunks, else Config.Chunks, else DefaultChunks). The limit is the
// smallest of max_tokens, max_completion_tokens and max_output_tokens present;
// a body with an invalid limit is refused by the server, and counts as unlimited here.
func CompletionTokens(body []byte, chunks int) int64 {
	n := int64(max(chunks, 0))
	if lim, err := outputLimit(gjson.ParseBytes(body)); err == nil && lim >= 0 && lim < n {
		n = lim
	}
	return n
}

// outputLimit returns the tightest output limit of the request, or -1.
func outputLimit(root gjson.Result) (int64, error) {
	lim := int64(-1)
	for _, f := range [...]string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		v := root.Get(f)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		if v.Type != gjson.Number || v.Num < 0 || v.Num != math.Trunc(v.Num) {
			return 0, fmt.Errorf("%s must be a non-negative integer", f)
		}
		n := int64(min(v.Num, maxChunks+1))
		if lim < 0 || n < lim {
			lim = n
		}
	}
	return lim, nil
}
