package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
)

// TestUsageWithoutPromptTokensBillsThePrompt: an OpenAI-style report with completion_tokens and
// total_tokens but no prompt_tokens (some compatible servers' whole report) billed the prompt
// at 0 and the total as output; one with completion_tokens alone billed the prompt at 0. The
// prompt is the total less the completion, else the prompt's estimate, marked estimated, as
// for a call without a usage report.
func TestUsageWithoutPromptTokensBillsThePrompt(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "no_prompt_total.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"completion_tokens":30,"total_tokens":1030}}`)
	writeFixture(t, dir, "no_prompt_stream.sse", "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello.\"}}]}\n\n"+
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[],\"usage\":{\"completion_tokens\":30}}\n\n"+
		"data: [DONE]\n\n")
	writeFixture(t, dir, "no_usage.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}`)
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","max_tokens":50,"messages":[{"role":"user","content":"say hello, and nothing else, please"}]}`
	price := pricing.Price{Input: h.cfg.Models["fake-gpt"].Input.Micro, Output: h.cfg.Models["fake-gpt"].Output.Micro}

	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_prompt_total.json"})
	if want := (pricing.Usage{Input: 1000, Output: 30}); run.Usage() != want || run.Estimated || run.CostMicro != price.Cost(want) {
		t.Errorf("completion and total: settled %+v (estimated %v) at %d µUSD, want %+v at %d, not estimated",
			run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
	}

	none, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_usage.json"})
	estimate := none.Usage().Input
	if !none.Estimated || estimate == 0 {
		t.Fatalf("no usage: settled %+v (estimated %v), want the prompt's estimate", none.Usage(), none.Estimated)
	}
	stream := `{"model":"fake-gpt","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"say hello, and nothing else, please"}]}`
	run, _ = h.answeredRun(u.ID, key, "/v1/chat/completions", stream, map[string]string{fakellm.HeaderReplay: "no_prompt_stream.sse"})
	if want := (pricing.Usage{Input: estimate, Output: 30}); run.Usage() != want || !run.Estimated || run.CostMicro != price.Cost(want) {
		t.Errorf("completion alone: settled %+v (estimated %v) at %d µUSD, want %+v at %d, estimated",
			run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
	}
}
