package proxy_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestOversizedUnreportedAnswerChargedAsReadWholeInEveryFormat: an Anthropic Messages answer
// or a Responses one too large to relay (502 upstream_response_too_large), read past to its end
// with no usage report in it, was charged its prompt's estimate alone, where the same answer
// relayed is charged its output too, estimated from its text (its text, thinking and tool
// inputs; its output items' text and arguments): the provider made that output and bills it.
// The text read past is measured as it goes by now, and the charge is the relayed one, whether
// the answer's Content-Length said it was too large or it was read past the limit.
//
// So too an answer whose usage report gives no figure of the output (completion_tokens or
// output_tokens absent or null, no total_tokens: a compatible server's), in every format: read
// whole, its output is the estimate of its text; read past, the text was added only when no
// report came at all, and the output was billed at 0.
func TestOversizedUnreportedAnswerChargedAsReadWholeInEveryFormat(t *testing.T) {
	words := strings.Repeat("words ", 20_000)
	const (
		claude    = `{"model":"claude-test","max_tokens":64000,"messages":[{"role":"user","content":"Say hello."}]}`
		responses = `{"model":"fake-gpt","input":"Say hello."}`
	)
	message := func(content string) string {
		return `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[` + content +
			`],"stop_reason":"end_turn","stop_sequence":null}`
	}
	response := func(output string) string {
		return `{"id":"resp_1","object":"response","status":"completed","model":"fake-gpt","output":[` + output + `]}`
	}
	const chat, completions = `{"model":"fake-gpt","messages":[{"role":"user","content":"Say hello."}]}`, `{"model":"fake-gpt","prompt":"Say hello."}`
	chatAnswer := func(text, usage string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			text + `"},"finish_reason":"stop"}],"usage":` + usage + `}`
	}
	completion := func(text string) string {
		return `{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[{"index":0,"text":"` + text +
			`","finish_reason":"stop"}],"usage":{"prompt_tokens":20}}`
	}
	reported := func(body string) string {
		return strings.Replace(body, `"stop_sequence":null`, `"stop_sequence":null,"usage":{"input_tokens":20}`, 1)
	}
	reportedResponse := func(output string) string {
		return strings.TrimSuffix(response(output), "}") + `,"usage":{"input_tokens":20,"output_tokens":null}}`
	}
	echo := strings.Repeat("the quick brown fox ", 1_000) // 20 KB
	echoed := `{"model":"fake-gpt","echo":true,"prompt":"` + echo + `"}`
	// A batch of two prompts with echo, a long one and a short one: each choice's echo is the
	// prompt its index names, or its position in choices when it names none (every element
	// counts). Here neither choice echoes the prompt it answers: all of its text is output,
	// read whole; read past, the first choice's text was matched against the long prompt by
	// counting choice objects, and 20 KB of output went unbilled.
	batch := `{"model":"fake-gpt","echo":true,"prompt":["` + echo + `","Say hello."]}`
	batchAnswer := func(choices string) string {
		return `{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[` + choices + `],"usage":{"prompt_tokens":20}}`
	}
	const absent, null = `{"prompt_tokens":20}`, `{"prompt_tokens":20,"completion_tokens":null,"total_tokens":null}`
	cases := []oversizedCase{
		{"chat, completion_tokens absent", "/v1/chat/completions", chat, chatAnswer("", absent), chatAnswer(words, absent)},
		{"chat, completion_tokens null", "/v1/chat/completions", chat, chatAnswer("", null), chatAnswer(words, null)},
		{"completions, completion_tokens absent", "/v1/completions", completions, completion(""), completion(words)},
		// With echo, the answer's text begins with its prompt, which is no output: counted past
		// it, as far as it is the prompt (a text that parts from it midway is all output).
		{"completions echoing its prompt", "/v1/completions", echoed, completion(""), completion(echo + words)},
		{"completions whose text parts from its prompt", "/v1/completions", echoed, completion(""),
			completion(echo[:10_000] + `\u00e9` + echo[10_000:] + words)},
		{"completions echoing by position, out of index order", "/v1/completions", batch, batchAnswer(``), batchAnswer(
			`{"text":"` + echo + words + `","index":1,"finish_reason":"stop"},{"text":"Say hello. Hi","index":0,"finish_reason":"stop"}`)},
		{"completions with a non-object element before a choice", "/v1/completions", batch, batchAnswer(``), batchAnswer(
			`null,{"text":"` + echo + words + `","finish_reason":"stop"}`)},
		{"anthropic, output_tokens absent", "/v1/messages", claude, reported(message(``)),
			reported(message(`{"type":"text","text":"` + words + `"}`))},
		{"responses, output_tokens null", "/v1/responses", responses, reportedResponse(``), reportedResponse(
			`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"` + words + `","annotations":[]}]}`)},
		{"anthropic text", "/v1/messages", claude, message(``), message(`{"type":"text","text":"` + words + `"}`)},
		{"anthropic thinking, escaped text and a tool's input", "/v1/messages", claude, message(``), message(
			`{"type":"thinking","thinking":"` + strings.ReplaceAll(words[:60_000], " ", `\n`) + `","signature":"c2ln"},` +
				`{"type":"text","text":"\u00e9` + words[:30_000] + `"},` +
				`{"type":"tool_use","id":"toolu_1","name":"f","input":{"text": "` + words[:60_000] + `", "n": [1, 2.5e3, true, null]}}`)},
		{"responses text", "/v1/responses", responses, response(``), response(
			`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"` + words + `","annotations":[]}]}`)},
		{"responses reasoning summary aside, text and a call's arguments", "/v1/responses", responses, response(``), response(
			`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"` + words[:20_000] + `"}]},` +
				`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"\ud83d\ude00` + words[:50_000] + `"}]},` +
				`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"{\"text\":\"` + words[:60_000] + `\"}"}`)},
	}
	up := &fixedUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	const limit = 96 << 10
	gateway := func(limit int64) *harness {
		return newHarness(t, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}},
				{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
			c.Plans["standard"] = bigPlan(c.Plans["standard"])
			c.Limits.MaxResponseBytes = limit
		})
	}
	small, whole := gateway(limit), gateway(32<<20)
	for _, tc := range cases {
		chargedAsReadWhole(t, small, whole, up, limit, tc)
	}
}
