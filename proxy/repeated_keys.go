package proxy

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/metering"
)

// keysBeforeSet is how many keys of one object repeatedKeyAnywhere compares one by one as they
// come: most objects of a request have a handful. One with more is checked once it has been
// read, its keys sorted.
const keysBeforeSet = 16

// repeatedKeyAnywhere returns a key that some object of the JSON raw (valid: parseObject has
// checked) holds more than once, compared unescaped, as "path.key" cut to what an error answer
// quotes (quotedValue), and whether there is one (the top level's repeated empty key is ""). The gateway reads
// the first of repeated keys (gjson), providers the last, at every depth: a message that shows
// the gateway a short "content" and the provider a long one was estimated (the charge of a
// call whose usage never came, the output bound within its cap) for the short one, and the
// provider billed the long one. No JSON encoder writes a key twice (RFC 8259 §4: names
// SHOULD be unique; I-JSON, RFC 7493, requires it), so a body that does is refused.
//
// One pass over the bytes, with no copy of a key that has no escape in it (see cacheControls
// for why the body is not walked level by level with gjson). An object of more than
// keysBeforeSet keys is checked when it closes, its keys (views of raw) sorted in place: kept
// in a set as they came, a 4 MiB object of 400 000 short keys took some 90 MiB as it was read,
// before anything was held.
func repeatedKeyAnywhere(raw string) (string, bool) {
	var (
		stack []keyFrame
		keys  []string
	)
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{', '[':
			stack = append(stack, keyFrame{object: c == '{', wantKey: c == '{', start: len(keys)})
		case '}', ']':
			n := len(stack)
			f := stack[n-1]
			if own := keys[f.start:]; len(own) > keysBeforeSet {
				if k, ok := repeatedSorted(own, strings.Compare); ok {
					return repeatedKeyPath(stack[:n-1], k), true
				}
			}
			keys = keys[:f.start]
			stack = stack[:n-1]
		case ',':
			if n := len(stack); n > 0 && stack[n-1].object {
				stack[n-1].wantKey = true
			}
		case '"':
			end, escaped := closingQuote(raw, i)
			n := len(stack)
			if n == 0 || !stack[n-1].wantKey {
				i = end
				continue
			}
			f := &stack[n-1]
			f.wantKey = false
			k := raw[i+1 : end]
			if escaped {
				k = gjson.Parse(raw[i : end+1]).Str
			}
			i = end
			if own := keys[f.start:]; len(own) <= keysBeforeSet && slices.Contains(own, k) {
				return repeatedKeyPath(stack[:n-1], k), true
			}
			f.key = k
			keys = appendDoubling(keys, k)
		}
	}
	return "", false
}

// keyFrame is an object or array open at a point of repeatedKeyAnywhere's walk.
type keyFrame struct {
	object  bool
	wantKey bool
	start   int    // an object's keys are keys[start:]
	key     string // the key whose value is being read
}

// repeatedKeyPath names the repeated key k of the object whose ancestors are outer, as far as
// an error answer quotes it (quotedValue), each key cut to that too: concatenated whole at every
// level, the path of a key repeated below thousands of long keys took seconds to build and
// quoted the body.
func repeatedKeyPath(outer []keyFrame, k string) string {
	path := make([]byte, 0, 64)
	for _, o := range outer {
		if len(path) > maxQuotedBytes {
			break
		}
		if o.object {
			path = append(append(path, o.key[:min(len(o.key), maxQuotedBytes+1)]...), '.')
		} else {
			path = append(bytes.TrimSuffix(path, []byte(".")), "[]."...)
		}
	}
	if len(path) <= maxQuotedBytes {
		path = append(path, k[:min(len(k), maxQuotedBytes+1)]...)
	}
	return quotedValue(string(path))
}

// closingQuote is the index of the quote that ends the JSON string opened at raw[open], and
// whether the string holds an escape (its text must be unescaped to be read as a key). raw has
// been validated as JSON, so the string is closed: no bound is checked.
func closingQuote(raw string, open int) (end int, escaped bool) {
	end = open + 1
	for raw[end] != '"' {
		if raw[end] == '\\' {
			end++
			escaped = true
		}
		end++
	}
	return end, escaped
}

// Keys the prompt's estimate reads in a message (a Responses input item) and in a content
// part: a provider that matches keys with case folded (Go's encoding/json) reads "Content"
// as content, which the estimate would not count. "type", "audio" and "input_audio" are not
// among them: the estimates read them with case folded themselves (a part's type, a Responses
// input item's), and a part or message that spells them so is served (and estimated as the
// media, or the reasoning, it names). A document's source's
// type is (sourceReadKeys): the estimate reads it as spelt, and a source of "Type" "text" was
// a text document estimated as one media part.
var (
	messageReadKeys = []string{"role", "content", "tool_calls", "function_call", "refusal", "output", "arguments",
		"input", "action", "operation", "tools", "reasoning_content", "reasoning", "summary", "encrypted_content",
		"code", "outputs", "queries", "results"}
	partReadKeys = []string{"text", "refusal", "content", "input", "source", "image", "prompt_string", "multimodal_data",
		"encrypted_content", "stdout", "stderr", "file_data", "file", "thinking", "signature", "data"}
	fileReadKeys     = []string{"file_data"}
	sourceReadKeys   = []string{"type", "data", "media_type", "content"}
	toolCallReadKeys = []string{"function", "custom"}
	argumentsKey     = []string{"arguments"}
	inputKey         = []string{"input"}
	textKey          = []string{"text"}
	actionReadKeys   = []string{"commands", "command"}
	diffKey          = []string{"diff"}
	logsKey          = []string{"logs"}
)

// repeatedPromptKey returns a key that a message, a tool call or a content part of the
// prompt repeats with case folded, or spells in another case than the one the estimate
// reads (repeatedKey), as "messages[3].Content"; or "". Exact repeats are refused at any
// depth (repeatedKeyAnywhere); here only the objects the estimate reads, whose keys are few
// and fixed, are compared with case folded (a tool's schema or a tool call's input may
// rightly hold "ID" beside "id").
func repeatedPromptKey(f metering.Format, root topObject) string {
	list := "messages"
	if f == metering.FormatResponses {
		list = "input"
	}
	if k := repeatedOutsideMessages(f, root); k != "" {
		return k
	}
	var found string
	i := -1
	root.Get(list).ForEach(func(_, m gjson.Result) bool {
		i++
		if !m.IsObject() {
			return true
		}
		var v messageValues
		if k, ok := repeatedKeyEach(m.Raw, messageReadKeys, v.keep); ok {
			found = k
			if k == "" {
				found = `""` // a repeated empty key: the path must not read as none
			}
		} else {
			found = v.repeatedKey()
		}
		return found == ""
	})
	if found != "" {
		return fmt.Sprintf("%s[%d].%s", list, i, found)
	}
	return ""
}

// repeatedOutsideMessages is repeatedPromptKey for the parts of the prompt outside its messages,
// which the estimate reads as a message's parts (metering's partLen): an Anthropic system
// prompt, a Responses request's instructions and its stored prompt's variables, a completions
// prompt (llama.cpp's of text and media: one object, or a batch of them), an embeddings input
// (Jina's parts). {"prompt":{"Prompt_String":<long>}} was billed by a provider that folds key
// case and estimated at nothing.
func repeatedOutsideMessages(f metering.Format, root topObject) string {
	switch f {
	case metering.FormatAnthropic:
		return repeatedPartKey(root.Get("system"), "system", 0)
	case metering.FormatResponses:
		if k := repeatedPartKey(root.Get("instructions"), "instructions", 0); k != "" {
			return k
		}
		var found string
		root.Get("prompt.variables").ForEach(func(name, v gjson.Result) bool {
			if v.IsObject() {
				if k := repeatedKeyInPart(v, 0); k != "" {
					found = "prompt.variables." + name.Str + k
				}
			} else {
				found = repeatedPartKey(v, "prompt.variables."+name.Str, 1)
			}
			return found == ""
		})
		return found
	case metering.FormatCompletions:
		if prompt := root.Get("prompt"); prompt.IsObject() {
			if k := repeatedKeyInPart(prompt, 0); k != "" {
				return "prompt" + k
			}
		} else {
			return repeatedPartKey(prompt, "prompt", 0)
		}
	case metering.FormatEmbeddings:
		return repeatedPartKey(root.Get("input"), "input", 0)
	}
	return ""
}

// messageValues are the raw members of a message (a Responses input item) whose own keys the
// estimate reads, kept as repeatedPromptKey passes them ("" when absent).
type messageValues struct {
	content, toolCalls, functionCall  string
	output, summary, results, queries string
	action, operation, outputs        string
}

// keep is repeatedKeyEach's each for a message: it keeps the members repeatedKey walks.
func (v *messageValues) keep(k, raw string) {
	switch k {
	case "content":
		v.content = raw
	case "tool_calls":
		v.toolCalls = raw
	case "function_call":
		v.functionCall = raw
	case "output":
		v.output = raw
	case "summary":
		v.summary = raw
	case "results":
		v.results = raw
	case "queries":
		v.queries = raw
	case "action":
		v.action = raw
	case "operation":
		v.operation = raw
	case "outputs":
		v.outputs = raw
	}
}

// repeatedKey is repeatedPromptKey for what a message's members hold, as deep as the estimate
// reads it (metering's addChat, addResponsesInput, addToolOutput), as "content[0].Text"; or "":
// its parts (content; a tool's output, a reasoning summary, a file search's queries and results,
// each counted as parts are), a tool output that is one object (its text), its tool calls,
// legacy function calling's call (its arguments), a shell's commands, a patch's diff, a code
// interpreter's logs. Read as spelt, any of them spelt in another case was billed by a provider
// that folds key case and not estimated.
func (v *messageValues) repeatedKey() string {
	for _, parts := range [...]struct{ at, raw string }{
		{"content", v.content}, {"output", v.output}, {"summary", v.summary}, {"results", v.results}, {"queries", v.queries},
	} {
		if k := repeatedPartKey(containerAt(parts.raw), parts.at, 0); k != "" {
			return k
		}
	}
	if k := repeatedToolCallKey(containerAt(v.toolCalls)); k != "" {
		return k
	}
	for _, obj := range [...]struct {
		at, raw string
		read    []string
	}{
		{"function_call.", v.functionCall, argumentsKey},
		{"output.", v.output, textKey}, // a computer-use screenshot, an input part (addToolOutput)
		{"action.", v.action, actionReadKeys},
		{"operation.", v.operation, diffKey},
	} {
		if k, ok := repeatedKeyEach(obj.raw, obj.read, nil); ok {
			return obj.at + k
		}
	}
	var found string
	i := -1
	containerAt(v.outputs).ForEach(func(_, out gjson.Result) bool {
		i++
		if k, ok := repeatedKeyEach(out.Raw, logsKey, nil); ok {
			found = fmt.Sprintf("outputs[%d].%s", i, k)
		}
		return found == ""
	})
	return found
}

// repeatedPartKey is repeatedPromptKey for the parts of a content array at, and the parts
// nested in theirs (an Anthropic tool_result), as deep as the estimate reads them.
func repeatedPartKey(content gjson.Result, at string, depth int) string {
	if !content.IsArray() || depth >= maxPartDepth {
		return ""
	}
	var found string
	i := -1
	content.ForEach(func(_, p gjson.Result) bool {
		i++
		if p.IsObject() {
			found = repeatedKeyInPart(p, depth)
		} else {
			found = repeatedPartKey(p, "", depth+1)
		}
		return found == ""
	})
	if found != "" {
		return fmt.Sprintf("%s[%d]%s", at, i, found)
	}
	return ""
}

// repeatedKeyInPart is repeatedPartKey for one part at depth: its own keys, then its content's
// parts, a list of them (an Anthropic tool_result) or one block (a web_fetch_tool_result's
// web_fetch_result, whose document the estimate reads as a part's, so a "Content" beside it was
// the fetched page, billed by a provider that folds case and never estimated).
func repeatedKeyInPart(p gjson.Result, depth int) string {
	var inner, source, file string
	if k, ok := repeatedKeyEach(p.Raw, partReadKeys, func(k, v string) {
		switch k {
		case "content":
			inner = v
		case "source":
			source = v
		case "file":
			file = v
		}
	}); ok {
		return "." + k
	}
	if k := repeatedSourceKey(source, depth); k != "" {
		return ".source" + k
	}
	// A chat file part's file, whose file_data (a PDF's data URL) the estimate reads for its
	// pages (metering's pdfPartTokens).
	if k, ok := repeatedKeyEach(file, fileReadKeys, nil); ok {
		return ".file." + k
	}
	if !strings.HasPrefix(inner, "{") {
		return repeatedPartKey(containerAt(inner), ".content", depth+1)
	}
	if depth+1 >= maxPartDepth {
		return "" // the estimate counts the block's raw bytes, case variants and all
	}
	if k := repeatedKeyInPart(gjson.Parse(inner), depth+1); k != "" {
		return ".content" + k
	}
	return ""
}

// repeatedSourceKey is repeatedKeyInPart for a part's source (raw, "" when none) at depth: an
// Anthropic document's, whose type, text, media type and data the estimate reads (metering's
// documentTextLen, pdfPartTokens), and the content blocks it holds, as deep as it counts them.
// {"Type":"text","data":…} or {"type":"text","Data":…} was a 100 KB text estimated as one
// media part, and billed whole by a provider that folds case.
func repeatedSourceKey(raw string, depth int) string {
	if !strings.HasPrefix(raw, "{") {
		return ""
	}
	var content string
	if k, ok := repeatedKeyEach(raw, sourceReadKeys, func(k, v string) {
		if k == "content" {
			content = v
		}
	}); ok {
		return "." + k
	}
	return repeatedPartKey(containerAt(content), ".content", depth+1)
}

// containerAt is raw, a member's value, for repeatedPartKey and repeatedToolCallKey to walk if
// it is an array or an object; a scalar is not parsed (a string would be unescaped for
// nothing, and neither walks one).
func containerAt(raw string) gjson.Result {
	if !strings.HasPrefix(raw, "[") && !strings.HasPrefix(raw, "{") {
		return gjson.Result{}
	}
	return gjson.Parse(raw)
}

// maxPartDepth is how deep repeatedPartKey looks: as deep as the estimate counts parts
// (metering's maxContentDepth, 4), and no deeper, where it counts raw bytes.
const maxPartDepth = 4

// repeatedToolCallKey is repeatedPromptKey for a chat message's tool calls, whose function's
// arguments, or custom tool's input, the estimate counts.
func repeatedToolCallKey(calls gjson.Result) string {
	var found string
	i := -1
	calls.ForEach(func(_, tc gjson.Result) bool {
		i++
		if !tc.IsObject() {
			return true
		}
		var function, custom string
		if k, ok := repeatedKeyEach(tc.Raw, toolCallReadKeys, func(k, v string) {
			switch k {
			case "function":
				function = v
			case "custom":
				custom = v
			}
		}); ok {
			found = k
			if k == "" {
				found = `""` // a repeated empty key: the path must not read as none
			}
		} else if k, ok := repeatedKeyEach(function, argumentsKey, nil); ok {
			found = "function." + k
		} else if k, ok := repeatedKeyEach(custom, inputKey, nil); ok {
			found = "custom." + k
		}
		return found == ""
	})
	if found != "" {
		return fmt.Sprintf("tool_calls[%d].%s", i, found)
	}
	return ""
}
