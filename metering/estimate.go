package metering

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/jsontop"
)

// Estimates stand in for usage the upstream never reported (a client that left before the
// usage chunk, a provider that sends none). They follow the common rule of thumb of four
// bytes of text per token, plus a small per-message overhead, and are marked estimated on the
// settled row so nobody mistakes them for the provider's count.
const (
	bytesPerToken      = 4
	tokensPerMessage   = 4
	maxEstimatedTokens = 1 << 30
	// tokensPerMedia stands for an image, audio clip or file part, whose size in tokens its
	// bytes do not tell (a URL, or base64 of a compressed format): about what a large image
	// costs at OpenAI (high detail) and Anthropic (~1.15 megapixels). Counted as nothing, a
	// prompt of images was estimated at a few tokens, and a call cancelled before its usage
	// came was charged as much.
	tokensPerMedia = 1600
)

// mediaPartTypes are the content part types that carry media rather than text, across the
// formats.
var mediaPartTypes = map[string]bool{
	"image_url": true, "input_image": true, "image": true, // chat, Responses, Anthropic
	"input_audio": true,                                       // chat
	"file":        true, "input_file": true, "document": true, // chat, Responses, Anthropic
}

// EstimatePrompt guesses the prompt of a request body in format f: its tokens (input, audio
// included) and, apart, the audio part of them (estimateAudio), which the provider bills at its
// own price. One look for audio serves both: the look reads every byte (15 µs on a 97 KB prompt).
// body is valid JSON (the gateway checks it first); of other bytes the estimates are bounded
// but arbitrary.
func EstimatePrompt(f Format, body []byte) (input, audio int64) {
	mayAudio := (f == FormatChat || f == FormatResponses) && mayHoldAudio(body)
	return estimateInput(f, body, mayAudio), estimateAudio(f, body, mayAudio)
}

// estimateInput is EstimatePrompt's input; mayAudio is whether body may hold audio (mayHoldAudio).
func estimateInput(f Format, body []byte, mayAudio bool) int64 {
	var p promptSize
	// Viewed, not copied (only lengths are kept, nothing outlives body), and indexed once: of
	// the keys read below most are absent from a given body, and gjson finds an absent key
	// only by skipping every member, a pass over the whole prompt for each (GetBytes also
	// copied the messages each time it found them).
	top := jsontop.Index(gjson.Parse(unsafeString(body)))
	// Tool definitions and an output schema are part of the prompt the provider counts.
	p.textBytes += int64(len(top.Get("tools").Raw))
	p.textBytes += int64(len(top.Get("response_format").Raw))
	p.textBytes += int64(len(top.Get("text.format").Raw))
	switch f {
	case FormatChat:
		// The function definitions of chat's function calling before tools (functions).
		p.textBytes += int64(len(top.Get("functions").Raw))
		p.addChat(top.Get("messages"), mayAudio)
	case FormatAnthropic:
		// Anthropic's output schema (output_config.format; output_format under its
		// structured-outputs beta), which it explains to the model in a system prompt of its own.
		p.textBytes += int64(len(top.Get("output_config.format").Raw))
		p.textBytes += int64(len(top.Get("output_format").Raw))
		// A system prompt is a message of its own to the model, with the same overhead (as
		// a chat request's system message is); so is a Responses request's instructions, and
		// its input given as one string.
		p.message(top.Get("system"))
		var loopThinking int64
		top.Get("messages").ForEach(func(_, m gjson.Result) bool {
			p.messages++
			var content, role string
			jsontop.Members(m.Raw, func(k, v string) bool {
				switch k {
				case "content":
					firstOf(&content, v)
				case "role":
					firstOf(&role, v)
				}
				return true
			})
			p.textBytes += rawTextLen(content, 0)
			c := containerAt(content)
			if gjson.Parse(role).Str == "user" && !onlyToolResults(c) {
				loopThinking = 0 // a new turn: Anthropic strips the thinking before it
			} else {
				loopThinking += thinkingLen(c)
			}
			return true
		})
		p.textBytes += loopThinking
	case FormatResponses:
		p.message(top.Get("instructions"))
		p.addResponsesInput(top.Get("input"))
		// A stored prompt's variables: its own text is not in the body, their values are, and
		// the provider puts them into the prompt (a string, or an input part each).
		top.Get("prompt.variables").ForEach(func(_, v gjson.Result) bool {
			p.textBytes += partLen(v, 0)
			return true
		})
	case FormatCompletions:
		if prompt := top.Get("prompt"); prompt.IsObject() {
			// llama.cpp's server's prompt of text and media, one object (partLen).
			p.textBytes += partLen(prompt, 0)
		} else {
			p.count(prompt)
		}
		// Text to insert before (insert mode): the model reads it as prompt.
		p.count(top.Get("suffix"))
	case FormatEmbeddings:
		p.count(top.Get("input"))
		// vLLM's chat-style embeddings take the input as messages (a multimodal embedding
		// model's images too), billed as the prompt.
		p.addChat(top.Get("messages"), false)
	}
	return min(maxEstimatedTokens, ceilDiv(p.textBytes, bytesPerToken)+p.messages*tokensPerMessage)
}

// promptSize is what a prompt's estimate is made of: its text's bytes and its messages, each
// of which costs the model tokensPerMessage of its own.
type promptSize struct {
	textBytes, messages int64
}

// count adds the text v holds.
func (p *promptSize) count(v gjson.Result) {
	p.textBytes += textLen(v)
}

// message counts v as a message of its own when it holds text.
func (p *promptSize) message(v gjson.Result) {
	if n := textLen(v); n > 0 {
		p.messages++
		p.textBytes += n
	}
}

// addChat adds a chat request's messages. An earlier spoken answer sent back ({"audio":
// {"id": …}}) is heard again, a part of the prompt beside its text: counted as estimateAudio
// counts it (whose estimate is the audio part of this one, not more to it). Only looked for
// in a body that may hold one (spoken): most do not, and the look is a second pass over every
// message.
func (p *promptSize) addChat(messages gjson.Result, spoken bool) {
	// The reasoning sent back since the last user message, and whether a tool was called since.
	var turnReasoning int64
	var turnTools bool
	messages.ForEach(func(_, m gjson.Result) bool {
		p.messages++
		var role, content, toolCalls, functionCall, refusal, reasoningContent, reasoning string
		jsontop.Members(m.Raw, func(k, v string) bool {
			switch k {
			case "role":
				firstOf(&role, v)
			case "reasoning_content":
				firstOf(&reasoningContent, v)
			case "reasoning":
				firstOf(&reasoning, v)
			case "content":
				firstOf(&content, v)
			case "tool_calls":
				firstOf(&toolCalls, v)
			case "function_call":
				firstOf(&functionCall, v)
			case "refusal":
				firstOf(&refusal, v)
			}
			if spoken && strings.EqualFold(k, "audio") && strings.HasPrefix(v, "{") {
				p.textBytes += SentBackAnswerTokens * bytesPerToken
			}
			return true
		})
		if gjson.Parse(role).Str == "user" {
			p.endChatTurn(turnReasoning, turnTools)
			turnReasoning, turnTools = 0, false
		}
		p.textBytes += rawTextLen(content, 0)
		gjson.Parse(toolCalls).ForEach(func(_, tc gjson.Result) bool {
			p.textBytes += int64(len(tc.Get("function.arguments").String()))
			p.textBytes += strLen(tc.Get("custom.input")) // a custom tool's call
			turnTools = true
			return true
		})
		// A function call of chat's function calling before tools (function_call), which
		// OpenAI still serves.
		if fc := gjson.Parse(functionCall); fc.IsObject() {
			p.textBytes += int64(len(fc.Get("arguments").String()))
			turnTools = true
		}
		p.textBytes += rawStringLen(refusal) // an assistant turn's refusal
		// An assistant's reasoning sent back (DeepSeek's reasoning_content, a router's
		// reasoning; the same text when a message gives both).
		turnReasoning += max(rawStrLen(reasoningContent), rawStrLen(reasoning))
		return true
	})
	p.endChatTurn(turnReasoning, turnTools)
}

// endChatTurn adds the reasoning a chat turn (the messages from a user message to the next)
// sent back, when the turn called a tool: a provider that shows its reasoning (DeepSeek) keeps
// that of a turn with tool calls in the model's context, in every later request, and bills it
// as input; that of a turn without it ignores, unbilled.
func (p *promptSize) endChatTurn(reasoning int64, tools bool) {
	if tools {
		p.textBytes += reasoning
	}
}

// addResponsesInput adds a Responses request's input: one string (a message of its own) or
// a list of items.
func (p *promptSize) addResponsesInput(in gjson.Result) {
	if !in.IsArray() {
		p.message(in)
		return
	}
	var loopReasoning int64
	in.ForEach(func(_, item gjson.Result) bool {
		p.messages++
		if item.Type == gjson.String {
			p.count(item) // a bare string is a user message
			loopReasoning = 0
		}
		var typ, role, content, output, arguments, input, action, operation, tools, summary, encrypted string
		var code, outputs, queries, results string
		jsontop.Members(item.Raw, func(k, v string) bool {
			// An item's type is read with case folded, as partLen reads a part's: a provider
			// decoding with Go's encoding/json reads {"Type":"reasoning"} as a reasoning item,
			// and bills its summary, which read as no type went uncounted.
			if strings.EqualFold(k, "type") {
				firstOf(&typ, v)
				return true
			}
			switch k {
			case "role":
				firstOf(&role, v)
			case "summary":
				firstOf(&summary, v)
			case "encrypted_content":
				firstOf(&encrypted, v)
			case "content":
				firstOf(&content, v)
			case "output":
				firstOf(&output, v)
			case "arguments":
				firstOf(&arguments, v)
			case "input":
				firstOf(&input, v)
			case "action":
				firstOf(&action, v)
			case "operation":
				firstOf(&operation, v)
			case "tools":
				firstOf(&tools, v)
			case "code":
				firstOf(&code, v)
			case "outputs":
				firstOf(&outputs, v)
			case "queries":
				firstOf(&queries, v)
			case "results":
				firstOf(&results, v)
			}
			return true
		})
		switch {
		case gjson.Parse(typ).Str == "reasoning":
			// The reasoning the model did in the current tool loop, sent back for it to read on:
			// its text (summary, reasoning text) or, with store off, all of it encrypted, which
			// the provider decrypts for the model and bills as input. Opaque, its bytes stand for
			// its tokens (as a redacted_thinking block's data's); the larger of the two counts,
			// not both, which tell the same reasoning. The provider drops the reasoning of turns
			// before the last user message, unbilled.
			loopReasoning += max(rawTextLen(summary, 0)+rawTextLen(content, 0), rawStrLen(encrypted))
			return true
		case gjson.Parse(role).Str == "user":
			loopReasoning = 0 // a new turn
		}
		p.textBytes += rawTextLen(content, 0)
		p.addToolOutput(output)
		p.textBytes += rawStringLen(arguments) // function_call
		// What the model wrote for a custom tool, a shell or a patch, sent back in a tool
		// loop: the provider bills it as input, as it does a function call's arguments.
		p.textBytes += rawStrLen(input) // custom_tool_call
		act := gjson.Parse(action)
		p.count(act.Get("commands")) // shell_call
		p.count(act.Get("command"))  // local_shell_call
		p.textBytes += strLen(gjson.Parse(operation).Get("diff"))
		// An MCP server's tool list sent back (mcp_list_tools): the provider reads it, as it
		// does the request's own tool definitions, instead of listing the tools again.
		p.textBytes += int64(len(tools))
		// What a hosted tool did, sent back: the model reads it, and the provider bills it as
		// input. A compaction's encrypted content (the context before it, opaque: its bytes
		// stand for its tokens), a code interpreter's code and logs, a file search's queries
		// and the text of the chunks it found.
		p.textBytes += rawStrLen(encrypted) + rawStrLen(code)
		containerAt(outputs).ForEach(func(_, out gjson.Result) bool {
			p.textBytes += strLen(out.Get("logs"))
			return true
		})
		p.textBytes += rawTextLen(queries, 0) + rawTextLen(results, 0)
		return true
	})
	p.textBytes += loopReasoning
}

// addToolOutput adds a tool's output sent back in a Responses input item: a function's (a
// string, or a list of parts), a shell's (a list of stdout and stderr chunks, which partLen
// reads as it does Anthropic's code execution output) or a computer-use screenshot (one image,
// an object, its type read with case folded: foldedType). Counted as text parts only, a
// computer-use loop of screenshots was estimated at a few tokens.
func (p *promptSize) addToolOutput(raw string) {
	if strings.HasPrefix(raw, "{") {
		out := gjson.Parse(raw)
		if t := foldedType(raw); t == "computer_screenshot" || mediaPartTypes[t] {
			p.textBytes += tokensPerMedia * bytesPerToken
		} else {
			p.textBytes += strLen(out.Get("text"))
		}
		return
	}
	p.textBytes += rawTextLen(raw, 0) // a shell's chunks too: partLen counts their stdout and stderr
}

// foldedType is the type of the JSON object raw: its "type" member read with case folded, as
// partLen reads a part's and a provider decoding with Go's encoding/json reads it ({"Type":
// "computer_screenshot"} is a screenshot), the first of them (the gateway refuses a key spelt
// twice); "" when there is none, or it is no string.
func foldedType(raw string) string {
	var typ string
	jsontop.Members(raw, func(k, v string) bool {
		if strings.EqualFold(k, "type") {
			typ = v
			return false
		}
		return true
	})
	return gjson.Parse(typ).Str
}

// onlyToolResults reports whether an Anthropic user turn's content is tool results alone: a
// turn of the tool loop the assistant's last thinking belongs to, not a new one. A block's type
// is read with case folded (foldedType): {"Type":"tool_result"} read as spelt made a tool
// loop's turn a new one, and the thinking it carries was dropped from the estimate.
func onlyToolResults(content gjson.Result) bool {
	if !content.IsArray() {
		return false
	}
	only := true
	content.ForEach(func(_, b gjson.Result) bool {
		only = foldedType(b.Raw) == "tool_result"
		return only
	})
	return only
}

// thinkingLen is the thinking an Anthropic assistant turn sends back: a thinking block's text
// or its signature, a redacted_thinking block's encrypted data (its tokens are not known; its
// bytes stand for them). The signature holds the whole thinking encrypted, which the model
// reads back (on Claude 4 models the text is only a summary of it; on Claude 3.7 the text is
// the whole and the signature short): the larger of the two counts, not both. Within the
// current tool loop the caller must send it back, and Anthropic bills it as input; thinking
// before the last user turn it strips, unbilled (see estimateInput). A block's type is read with
// case folded (foldedType), as a provider decoding with Go's encoding/json reads it.
func thinkingLen(content gjson.Result) int64 {
	var n int64
	content.ForEach(func(_, b gjson.Result) bool {
		switch foldedType(b.Raw) {
		case "thinking":
			n += max(strLen(b.Get("thinking")), strLen(b.Get("signature")))
		case "redacted_thinking":
			n += strLen(b.Get("data"))
		}
		return true
	})
	return n
}

// EstimateNotHandedOn guesses the tokens of a Responses request's own parts that a
// continuation of its answer (previous_response_id) or of its conversation does not carry:
// its instructions, tool definitions and output schema, which a continuation sends again (and
// its estimate counts from its own body). The provider's prompt count includes them.
func EstimateNotHandedOn(body []byte) int64 {
	instructions := textLen(gjson.GetBytes(body, "instructions"))
	textBytes := int64(len(gjson.GetBytes(body, "tools").Raw)) + int64(len(gjson.GetBytes(body, "text.format").Raw)) + instructions
	var messages int64
	if instructions > 0 {
		messages = 1 // a message of its own, as estimateInput counts it
	}
	return min(maxEstimatedTokens, ceilDiv(textBytes, bytesPerToken)+messages*tokensPerMessage)
}

// PromptEstimates is the estimate of each prompt of a completions batch, prompt an array of
// them (strings, or arrays of tokens): its text's tokens, a token array's one an element, as
// EstimatePrompt counts them all together (Meter.BatchPrompts).
func PromptEstimates(prompt gjson.Result) []int64 {
	var estimates []int64
	prompt.ForEach(func(_, v gjson.Result) bool {
		estimates = append(estimates, min(maxEstimatedTokens, ceilDiv(partLen(v, 0), bytesPerToken)))
		return true
	})
	return estimates
}

// EstimateOutputTokens turns streamed text bytes into tokens.
func EstimateOutputTokens(outputBytes int64) int64 {
	return min(maxEstimatedTokens, ceilDiv(outputBytes, bytesPerToken))
}

// UserTurns counts the user messages of a conversation: enough of them make a call "heavy"
// and it gets the larger hold.
func UserTurns(f Format, body []byte) int {
	path := "messages"
	if f == FormatResponses {
		path = "input"
	}
	n := 0
	// Viewed, not copied: only the count is kept (GetBytes copied the whole list).
	gjson.Get(unsafeString(body), path).ForEach(func(_, m gjson.Result) bool {
		if m.Get("role").String() == "user" {
			n++
		}
		return true
	})
	return n
}

// textLen counts the text in a content value: a string, or an array of parts with text, or
// (for token-array prompts) one token per element.
func textLen(v gjson.Result) int64 { return textLenAt(v, 0) }

// maxContentDepth bounds how deep textLen looks into nested content (real requests nest
// two levels: a tool_result's content blocks, a batch of token arrays). Past it a value
// counts by its raw size: each level's parse scans what is nested below it, so following
// every level of a deeply nested body costs time quadratic in its size.
const maxContentDepth = 4

func textLenAt(v gjson.Result, depth int) int64 {
	switch {
	case v.Type == gjson.String:
		return int64(len(v.Str))
	case depth >= maxContentDepth:
		return int64(len(v.Raw))
	case v.IsArray():
		var n int64
		v.ForEach(func(_, part gjson.Result) bool {
			n += partLen(part, depth)
			return true
		})
		return n
	}
	return 0
}

// partLen counts the text in one element of a content array at depth: a string, a token, a
// nested array, or a part.
func partLen(part gjson.Result, depth int) int64 {
	switch {
	case part.Type == gjson.String:
		return int64(len(part.Str))
	case part.Type == gjson.Number:
		return bytesPerToken
	case part.IsArray():
		return textLenAt(part, depth+1)
	}
	var typ, text, refusal, content, input, encrypted, stdout, stderr, image, promptString, media string
	jsontop.Members(part.Raw, func(k, v string) bool {
		// A part's type is read with case folded, as the audio estimate reads it (isAudioPart)
		// and a provider decoding with Go's encoding/json does: {"Type":"image_url"} read as
		// no type was estimated at its few bytes, and billed as an image. (A part that spells
		// it twice is refused before it is estimated.)
		if strings.EqualFold(k, "type") {
			firstOf(&typ, v)
			return true
		}
		switch k {
		case "prompt_string":
			firstOf(&promptString, v)
		case "multimodal_data":
			firstOf(&media, v)
		case "image":
			firstOf(&image, v)
		case "encrypted_content":
			firstOf(&encrypted, v)
		case "stdout":
			firstOf(&stdout, v)
		case "stderr":
			firstOf(&stderr, v)
		case "text":
			firstOf(&text, v)
		case "refusal":
			firstOf(&refusal, v)
		case "content":
			firstOf(&content, v)
		case "input":
			firstOf(&input, v)
		}
		return true
	})
	if typ == "" && strings.HasPrefix(image, `"`) {
		// An image input without a type (Jina's multimodal embeddings: {"image": a URL or
		// base64}), billed as tokens: one media part.
		return tokensPerMedia * bytesPerToken
	}
	if t := gjson.Parse(typ).Str; mediaPartTypes[t] {
		if t == "input_audio" {
			return clipTokens(part) * bytesPerToken // as estimateAudio counts it
		}
		if tokens, ok := pdfPartTokens(part); ok {
			return max(tokensPerMedia, tokens) * bytesPerToken
		}
		return max(tokensPerMedia*bytesPerToken, documentTextLen(part, depth))
	}
	n := rawStringLen(text)
	// llama.cpp's server's prompt of text and media (a completions prompt, or one of a batch:
	// tokenize_input_subprompt): its text a string, or token ids with text between them, and
	// each of its media (base64 images or audio) one media part.
	n += rawTextLen(promptString, depth+1)
	if strings.HasPrefix(media, "[") {
		gjson.Parse(media).ForEach(func(_, _ gjson.Result) bool {
			n += tokensPerMedia * bytesPerToken
			return true
		})
	}
	// An assistant's refusal sent back (chat's part, a Responses output message's).
	n += rawStringLen(refusal)
	// What a tool gave the model, sent back: an Anthropic web search result's page, encrypted
	// (opaque: its bytes stand for its tokens), a code execution's output (Anthropic's, in an
	// object; a Responses shell's chunks).
	n += rawStrLen(encrypted) + rawStrLen(stdout) + rawStrLen(stderr)
	switch object := strings.HasPrefix(content, "{"); {
	case object && depth+1 >= maxContentDepth:
		n += int64(len(content))
	case object:
		// One block, not a list: an Anthropic web_fetch_tool_result's web_fetch_result, and
		// its document, the fetched page sent back, which the provider bills as input.
		n += partLen(gjson.Parse(content), depth+1)
	case content != "": // Anthropic tool_result
		n += rawTextLen(content, depth+1)
	}
	if strings.HasPrefix(input, "{") { // Anthropic tool_use
		n += int64(len(input))
	}
	return n
}

// documentTextLen is the text an Anthropic document part carries in the body (a source of
// type text, or of content blocks), whose bytes tell its tokens as a message's do: counted as
// one media part, a 100 KB text document was estimated at 1 600 tokens. 0 for any other part.
func documentTextLen(part gjson.Result, depth int) int64 {
	src := part.Get("source")
	switch src.Get("type").Str {
	case "text":
		return int64(len(src.Get("data").String()))
	case "content":
		return textLenAt(src.Get("content"), depth+1)
	}
	return 0
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// The estimate reads a message's or a part's members in one pass (jsontop.Members), as raw
// JSON, and measures long strings without unescaping them (jsontop.UnescapedLen): each gjson
// Get of a member was a pass over the object, and each string it handed over was unescaped
// into a copy only to be measured. The helpers below read a raw member as gjson's Result
// would.

// firstOf keeps v, a member's raw value, in *dst unless an earlier member of the same key
// did: gjson reads the first of repeated keys.
func firstOf(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

// rawTextLen is textLenAt of a raw member ("" when absent).
func rawTextLen(raw string, depth int) int64 {
	if strings.HasPrefix(raw, `"`) {
		return int64(jsontop.UnescapedLen(raw))
	}
	return textLenAt(gjson.Parse(raw), depth) // no string: nothing to unescape
}

// rawStrLen is strLen of a raw member: a string's length, 0 for anything else.
func rawStrLen(raw string) int64 {
	return int64(jsontop.UnescapedLen(raw))
}

// rawStringLen is len(Result.String()) of a raw member: a string's length unescaped, no
// length for null or an absent member, a number as String formats it (1e5 is 100000, 1.50
// is 1.5: not its JSON's length), any other value's JSON.
func rawStringLen(raw string) int64 {
	if strings.HasPrefix(raw, `"`) {
		return int64(jsontop.UnescapedLen(raw))
	}
	return int64(len(gjson.Parse(raw).String())) // no string: nothing to unescape
}

// containerAt is a raw member as a Result if it is an array or an object (parsing one copies
// nothing), else none: the walks of its parts find nothing in a scalar, and a string would be
// unescaped for nothing.
func containerAt(raw string) gjson.Result {
	if !strings.HasPrefix(raw, "[") && !strings.HasPrefix(raw, "{") {
		return gjson.Result{}
	}
	return gjson.Parse(raw)
}
