package metering

import "github.com/tidwall/gjson"

// The paths an UnrelayedAnswer follows to the audio data and the text: its open containers
// (answerFrame), the role each value has on the path, and the keys that give it one (keyEnds).

// answerDepth is how deep the paths to the audio data and text go: the answer, choices, a
// choice, its message, its tool calls, a tool call, its function (or its audio); a Responses
// answer's output, an item, its content, a part (an Anthropic message's are shallower); a
// message's content as a list of chunks, a chunk, its thinking as a list of chunks.
// Deeper containers are counted, not followed.
const answerDepth = 8

// answerKeyLen bounds the keys an UnrelayedAnswer reads: the longest it looks for is
// "reasoning_content".
const answerKeyLen = 17

// answerFrame is an open container on the path to the audio data or the text.
type answerFrame struct {
	obj, expectKey bool  // an object, and whether its next string is a key
	role           uint8 // where it stands on the path to the audio data
	// The keys read once that were seen (a choice's "message" or "text", a function's
	// "arguments", a tool call's function holding "arguments", a content block's "text"): gjson's
	// Get reads the first.
	seen uint32
	// An Anthropic block's kind, by its first "type": not read yet, a compaction (whose content
	// is output text) or any other. held counts its content's text read before its type was.
	kind uint8
	held int64
	// A chat message's text counted under reasoning_content and under reasoning: the smaller
	// is taken back when it ends (reasoningOnce).
	reasoningContent, reasoning int64
}

// compactionType is the type of an Anthropic block whose content is output text.
const compactionType = "compaction"

// An Anthropic block's kind, by its type.
const (
	kindUnread uint8 = iota
	kindCompaction
	kindOther
)

// The keys of a container that are read once, as bits of its frame's seen.
const (
	firstMain       uint32 = 1 << iota // a choice's message (text), the answer's content (output), an item's content, an action's commands, an operation's diff
	firstFunction                      // a tool call's function holding arguments
	firstArguments                     // a function's, or an item's, arguments; an action's command
	firstText                          // a content block's or a part's text
	firstThinking                      // a content block's thinking
	firstInput                         // a content block's input, a Responses item's
	firstSummary                       // a Responses item's summary
	firstRefusal                       // a Responses part's refusal
	firstType                          // a content block's type
	firstContent                       // a content block's content
	firstCode                          // a Responses item's code
	firstAction                        // a Responses item's action
	firstOperation                     // a Responses item's operation
	firstCustom                        // a chat tool call's custom (a custom tool's call)
	firstUsage                         // an array's answer's usage
	firstPrompt                        // a usage's prompt_tokens
	firstCompletion                    // a usage's completion_tokens
	firstStop                          // an answer's stop, in llama.cpp's server's own shape
	firstOwnPrompt                     // its tokens_evaluated
	firstOwnOutput                     // its tokens_predicted
	firstTimings                       // an array's answer's timings
	firstCacheN                        // their cache_n
	firstIndex                         // a completions choice's index
)

// Where a value stands on the path to the audio data.
const (
	roleNone uint8 = iota
	roleTop
	roleChoices
	roleChoice
	roleMessage
	roleAudio
	roleData
	roleText             // a string whose bytes are output text
	roleToolCalls        // a message's tool_calls
	roleToolCall         // one of them
	roleFunction         // a tool call's function, or a message's function_call: its arguments are text
	roleBlocks           // an Anthropic message's content
	roleBlock            // one of its blocks
	roleRaw              // a value whose raw JSON is output text (a block's input)
	roleOutput           // a Responses answer's output
	roleItem             // one of its items
	roleParts            // an item's content
	rolePart             // one of its parts
	roleBlockType        // a block's type: a string read to tell a compaction
	roleBlockText        // a block's content: text when the block is a compaction
	roleAction           // a Responses item's action (a shell call's)
	roleCommands         // its commands: each a string of text
	roleOperation        // a Responses item's operation (a patch's): its diff is text
	roleCustom           // a chat tool call's custom: its input is text
	roleContent          // a chat message's content: text as a string, a list of chunks as a list
	roleReasoningContent // a chat message's reasoning_content: text, counted apart (see answerFrame)
	roleReasoning        // its reasoning: text, counted apart
	// A chat message's content given as a list of chunks, as Mistral's reasoning models answer
	// (chunksLen): each chunk's text, and its thinking, a string or a list of chunks whose
	// text is text.
	roleChunks     // the list
	roleChunk      // one of its chunks
	roleChunkThink // a chunk's thinking: text as a string, a list of chunks as a list
	roleThinkList  // that list
	roleThinkChunk // one of its chunks: its text is text
	// A completions answer given as a JSON array of whole answers (Meter.taskAnswers): the
	// array, each answer's usage, and that usage's prompt_tokens and completion_tokens.
	roleAnswers
	roleUsage
	roleFigurePrompt
	roleFigureCompletion
	// Each answer's timings, and their cache_n (Meter.answerCached).
	roleTimings
	roleFigureCacheN
	// A completions answer in llama.cpp's server's own shape (Meter.serverAnswer): its content,
	// text counted apart until the answer is known to be one (answerReport.ownText), its stop,
	// tokens_evaluated and tokens_predicted.
	roleOwnText
	roleStop
	roleOwnPrompt
	roleOwnCompletion
	roleIndex // a completions choice's index: the prompt its text echoes (choiceEcho)
)

// offPath reports whether the innermost open container is off the path to the audio data:
// nothing within it can be on the path (a value's role comes from its container's).
func (b *UnrelayedAnswer) offPath() bool {
	return b.depth > answerDepth || (b.depth > 0 && b.frames[b.depth-1].role == roleNone)
}

// top is the innermost open container followed, or nil when it is deeper than answerDepth or
// none is open.
func (b *UnrelayedAnswer) top() *answerFrame {
	if b.depth == 0 || b.depth > answerDepth {
		return nil
	}
	return &b.frames[b.depth-1]
}

// valueStarts returns the role of the value that starts here, and clears it: an element (or
// value) of choices is a choice, of tool_calls a tool call, a value is what its key made it
// (keyEnds).
func (b *UnrelayedAnswer) valueStarts() uint8 {
	role := b.pending
	b.pending = roleNone
	if f := b.top(); f != nil {
		// gjson's ForEach reads an object's values as an array's elements.
		switch f.role {
		case roleChoices:
			role = roleChoice
		case roleToolCalls:
			role = roleToolCall
		case roleBlocks:
			role = roleBlock
		case roleOutput:
			role = roleItem
		case roleParts:
			role = rolePart
		case roleCommands:
			role = roleText
		case roleChunks:
			role = roleChunk
		case roleThinkList:
			role = roleThinkChunk
		case roleAnswers:
			role = roleTop
		}
	}
	return role
}

// keyEnds sets what the value of the key just read is on the paths to the audio data and the
// text, as openAIObject, openAIChoices and spokenAnswer read a whole answer: every "choices"
// of the answer, the first "message" of a choice (its first "text" in a legacy completion),
// every "audio" of a message and every "data" and "transcript" of an audio, every "content",
// "reasoning_content", "reasoning", "refusal", "tool_calls" and "function_call" of a message,
// the first "function" of a tool call and the first "arguments" of a function, the first
// "input" of a tool call's first "custom". As Meter.Body reads an Anthropic message: the first
// "content" of the answer, and of each of its blocks the first "text", "thinking" and "input",
// and the first "content" when its first "type" is "compaction"; a Responses answer: the first
// "output" of the answer, of each of its items the first "arguments", "input", "content",
// "summary" and "code", the elements of the first "commands" and of the first "command" of its
// first "action" and the first "diff" of its first "operation", of each part the first "text"
// and "refusal".
func (b *UnrelayedAnswer) keyEnds() {
	f := b.top()
	if f != nil && f.role == roleChoices {
		// Choices given as an object: gjson's key of each is its key, read as a number.
		b.keyPos = -1
		if b.keyLen <= answerKeyLen {
			b.keyPos = gjson.Result{Type: gjson.String, Str: string(b.key[:b.keyLen])}.Int()
		}
	}
	if f == nil || b.keyLen > answerKeyLen {
		return
	}
	key := string(b.key[:b.keyLen])
	first := func(bit uint32, role uint8) {
		if f.seen&bit == 0 {
			b.pending = role
		}
		f.seen |= bit
	}
	switch f.role {
	case roleTop:
		if b.format == FormatCompletions {
			// What tells an answer in llama.cpp's server's own shape (answerReport.serverOwn),
			// and its keys.
			switch key {
			case "choices":
				b.element.choices = true
			case "usage":
				b.element.usage = true
			case "content":
				first(firstContent, roleOwnText)
			case "stop":
				first(firstStop, roleStop)
			case "tokens_evaluated":
				first(firstOwnPrompt, roleOwnPrompt)
			case "tokens_predicted":
				first(firstOwnOutput, roleOwnCompletion)
			}
		}
		switch {
		case b.format == FormatAnthropic && key == "content":
			first(firstMain, roleBlocks)
		case b.format == FormatResponses && key == "output":
			first(firstMain, roleOutput)
		case b.answers && key == "choices":
			first(firstMain, roleChoices) // a.Get("choices"), as taskAnswers reads an answer
		case (b.format == FormatChat || b.format == FormatCompletions) && key == "choices":
			b.pending = roleChoices
		case b.answers && key == "usage":
			first(firstUsage, roleUsage)
		case b.answers && key == "timings":
			first(firstTimings, roleTimings) // a.Get("timings").Get("cache_n"), as taskAnswers reads it
		}
	case roleTimings:
		if key == "cache_n" {
			first(firstCacheN, roleFigureCacheN)
		}
	case roleUsage:
		switch key {
		case "prompt_tokens":
			first(firstPrompt, roleFigurePrompt)
		case "completion_tokens":
			first(firstCompletion, roleFigureCompletion)
		}
	case roleChoice:
		if b.format == FormatCompletions && key == "text" {
			first(firstMain, roleText)
		} else if b.format == FormatCompletions && key == "index" {
			first(firstIndex, roleIndex) // c.Get("index"), as completionText reads it
		} else if b.format == FormatChat && key == "message" {
			first(firstMain, roleMessage)
		}
	case roleMessage:
		switch key {
		case "audio":
			b.pending = roleAudio
		case "content":
			b.pending = roleContent
		case "reasoning_content":
			b.pending = roleReasoningContent
		case "reasoning":
			b.pending = roleReasoning
		case "refusal":
			b.pending = roleText
		case "tool_calls":
			b.pending = roleToolCalls
		case "function_call":
			b.pending = roleFunction
		}
	case roleAudio:
		switch key {
		case "data":
			b.pending = roleData
		case "transcript":
			b.pending = roleText
		}
	case roleToolCall:
		// tc.Get("function.arguments") reads the first "arguments" of the first "function"
		// that is an object holding one: each "function" is read until one has held arguments
		// (roleFunction then marks this tool call firstFunction), none after it.
		switch {
		case key == "function" && f.seen&firstFunction == 0:
			b.pending = roleFunction
		case key == "custom":
			first(firstCustom, roleCustom)
		}
	case roleCustom:
		if key == "input" {
			first(firstInput, roleText)
		}
	case roleFunction:
		if key == "arguments" {
			first(firstArguments, roleText)
			if b.depth >= 2 && b.frames[b.depth-2].role == roleToolCall {
				b.frames[b.depth-2].seen |= firstFunction
			}
		}
	case roleBlock:
		switch key {
		case "text":
			first(firstText, roleText)
		case "thinking":
			first(firstThinking, roleText)
		case "input":
			first(firstInput, roleRaw)
		case "type":
			first(firstType, roleBlockType)
			if b.pending == roleBlockType {
				f.kind = kindOther // unless it is the string "compaction"
			}
		case "content":
			first(firstContent, roleBlockText)
		}
	case roleItem:
		switch key {
		case "arguments":
			first(firstArguments, roleText)
		case "input": // a custom tool call's
			first(firstInput, roleText)
		case "content":
			first(firstMain, roleParts)
		case "summary": // a reasoning item's
			first(firstSummary, roleParts)
		case "code": // a code interpreter call's
			first(firstCode, roleText)
		case "action":
			first(firstAction, roleAction)
		case "operation":
			first(firstOperation, roleOperation)
		}
	case roleAction:
		switch key {
		case "commands": // a shell call's
			first(firstMain, roleCommands)
		case "command": // a local shell call's
			first(firstArguments, roleCommands)
		}
	case roleOperation:
		if key == "diff" {
			first(firstMain, roleText)
		}
	case rolePart:
		switch key {
		case "text":
			first(firstText, roleText)
		case "refusal":
			first(firstRefusal, roleText)
		}
	case roleChunk:
		switch key {
		case "text":
			first(firstText, roleText)
		case "thinking":
			first(firstThinking, roleChunkThink)
		}
	case roleThinkChunk:
		if key == "text" {
			first(firstText, roleText)
		}
	}
}
