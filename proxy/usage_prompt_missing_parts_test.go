package proxy_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
)

// TestUsageWithoutPromptTokensKeepsItsCacheAndAudioParts: a report that gives the output and
// what was read from and written to the cache, but not the prompt, bills the prompt's estimate
// less those cached and written tokens (billed at their own prices already: counted in the
// input too, they were billed twice), and the estimate's audio at the audio price (at the text
// price, a sixteenth of what the provider charged).
func TestUsageWithoutPromptTokensKeepsItsCacheAndAudioParts(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "no_usage.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}`)
	writeFixture(t, dir, "no_prompt_cached.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],
"usage":{"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":100,"cache_write_tokens":50}}}`)
	h, price := audioHarness(t, dir)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","max_tokens":50,"messages":[{"role":"user","content":[{"type":"text","text":"Transcribe this."},
		{"type":"input_audio","input_audio":{"data":"` + wavMinute + `","format":"wav"}}]}]}`

	none, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_usage.json"})
	est := none.Usage()
	if !none.Estimated || est.Input <= 150 || est.AudioInput == 0 {
		t.Fatalf("no usage: settled %+v (estimated %v), want the prompt's estimate past 150 tokens, with its audio", est, none.Estimated)
	}

	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_prompt_cached.json"})
	input := est.Input - 100 - 50
	want := pricing.Usage{Input: input, CacheRead: 100, CacheWrite: 50, Output: 30, AudioInput: min(est.AudioInput, input)}
	if run.Usage() != want || !run.Estimated || run.CostMicro != price.Cost(want) {
		t.Errorf("settled %+v (estimated %v) at %d µUSD, want %+v at %d, estimated", run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
	}
}

// TestUsageWithoutPromptTokensOnACacheMarkedCall: a call that marks its prompt for the
// provider's cache (cache_control, a router serving Claude on the chat route), answered with a
// report of its output alone, bills its prompt's estimate at the cache-write price, as a call
// without a report does: the report does not say what the provider wrote to its cache, which
// it bills at up to 2× the input price. At the input price, it paid less than the provider
// charged.
func TestUsageWithoutPromptTokensOnACacheMarkedCall(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "no_usage.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}]}`)
	writeFixture(t, dir, "no_prompt.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"completion_tokens":30}}`)
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	m := h.cfg.Models["fake-gpt"]
	price := pricing.Price{Input: m.Input.Micro, CacheRead: m.CacheRead.Micro, CacheWrite: m.CacheWrite.Micro, Output: m.Output.Micro}
	body := `{"model":"fake-gpt","max_tokens":50,"messages":[{"role":"system","content":[{"type":"text",
		"text":"You are a careful coding agent, and you answer briefly.","cache_control":{"type":"ephemeral"}}]},
		{"role":"user","content":"say hello, and nothing else, please"}]}`

	none, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_usage.json"})
	est := none.Usage().Input
	if !none.Estimated || est == 0 {
		t.Fatalf("no usage: settled %+v (estimated %v), want the prompt's estimate", none.Usage(), none.Estimated)
	}
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderReplay: "no_prompt.json"})
	want := pricing.Usage{Input: est, Output: 30}
	if cost := price.PromptWritten(false).Cost(want); run.Usage() != want || !run.Estimated || run.CostMicro != cost {
		t.Errorf("settled %+v (estimated %v) at %d µUSD, want %+v at %d (the prompt at the cache-write price), estimated",
			run.Usage(), run.Estimated, run.CostMicro, want, cost)
	}
}
