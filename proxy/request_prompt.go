package proxy

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/pricing"
)

// What a call's prompt is: how many prompts a completions call holds and which it echoes, its
// estimated usage, and what it continues from at the provider.

// promptCount is how many prompts a completions request's prompt holds: an array of strings
// or of token arrays is a batch, answered prompt by prompt; a string, or one token array (an
// array of numbers), is one prompt. So is an array of both strings and numbers: llama.cpp's
// server reads it as one prompt, token ids with text between them, and runs it as one task
// whose report counts all of it (tokenize_input_prompts, "string or mixed"); read as a batch,
// its elements but the first were charged again at their estimates (Meter.BatchPrompts).
// OpenAI's API and vLLM refuse such a prompt.
func promptCount(prompt gjson.Result) int64 {
	if !prompt.IsArray() {
		return 1
	}
	var n int64
	tokens, numbers, text := true, false, false
	prompt.ForEach(func(_, v gjson.Result) bool {
		n++
		tokens = tokens && v.Type == gjson.Number
		numbers = numbers || v.Type == gjson.Number
		text = text || v.Type == gjson.String
		return true
	})
	if tokens || n == 0 || numbers && text {
		return 1
	}
	return n
}

// echoedPrompts are the prompts a completions call's echo answers with, in the order
// promptCount counts them (copies: the meter keeps them while the call runs): "" for a token
// array, whose text is not known.
func echoedPrompts(prompt gjson.Result) []string {
	text := func(v gjson.Result) string {
		if v.Type == gjson.String {
			return strings.Clone(v.Str)
		}
		return ""
	}
	if !prompt.IsArray() {
		return []string{text(prompt)}
	}
	if promptCount(prompt) == 1 {
		return []string{text(prompt.Get("0"))}
	}
	var prompts []string
	prompt.ForEach(func(_, v gjson.Result) bool {
		prompts = append(prompts, text(v))
		return true
	})
	return prompts
}

// promptEstimate is the prompt's estimated usage: its tokens (with the context it carries on
// from an earlier answer or a conversation), the audio part priced apart.
// The audio estimate reads parts the prompt's does not (keys in another case): the prompt is
// at least its audio, as Clamp bills it, so that the tally (unclamped) records what the
// settlement's row does.
func (c *callRequest) promptEstimate() pricing.Usage {
	return pricing.Usage{Input: max(c.inputEstimate, c.audioEstimate) + c.carried, AudioInput: c.audioEstimate}
}

// maxContinuedID bounds a response or conversation id the gateway looks up: longer is no id.
const maxContinuedID = 256

// continuedFrom returns what a Responses request continues: its previous_response_id and its
// conversation (an id, or an object with one); "" for either it does not name.
func continuedFrom(root topObject) (previousResponse, conversation string) {
	id := func(v gjson.Result) string {
		if v.Type == gjson.String && len(v.Str) <= maxContinuedID {
			return v.Str
		}
		return ""
	}
	conv := root.Get("conversation")
	if conv.IsObject() {
		conv = conv.Get("id")
	}
	return id(root.Get("previous_response_id")), id(conv)
}

// continues lists the ids the call's prompt continues, for Server.carriedContext.
func (c *callRequest) continues() []string {
	var ids []string
	for _, id := range []string{c.previousResponse, c.conversation} {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}
