package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestEchoedPromptIsNotChargedAsOutput: a /v1/completions call with echo answers each choice's
// text as its prompt followed by what the model wrote. The provider bills the prompt as input
// and only what it generated as output (completion_tokens). Charged without a usage report (a
// provider that sends none, a stream cut before it), the output's estimate counted every byte
// of the choices' text, the echoed prompt included: the prompt was charged twice, once as
// input and again at the output price. Only the text past each choice's echoed prompt is
// output (a batch's choice i answers prompt i/n), and only as far as it is the prompt: from a
// server that does not echo, all of the text is.
func TestEchoedPromptIsNotChargedAsOutput(t *testing.T) {
	p1 := strings.Repeat("the quick brown fox ", 200) // 4000 bytes
	p2 := strings.Repeat("jumps over the dog ", 100)  // 1900 bytes
	gen := []string{" Hello.", " Hi there.", " Yes.", " No, not at all."}
	dir := t.TempDir()
	writeFixture(t, dir, "echo_whole.json", `{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[{"index":0,"text":"`+
		p1+gen[0]+`","logprobs":null,"finish_reason":"stop"}]}`)
	// A server that does not echo: all of its text is the model's.
	ignored := strings.Repeat("an answer, not the prompt ", 40)
	writeFixture(t, dir, "echo_ignored.json", `{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[{"index":0,"text":"`+
		ignored+`","logprobs":null,"finish_reason":"stop"}]}`)
	var sse strings.Builder
	prompts := []string{p1, p1, p2, p2} // choice i answers prompt i/n, n = 2
	for i, g := range gen {
		// The echo comes first, alone or with the first generated token, as vLLM sends it.
		fmt.Fprintf(&sse, "data: {\"id\":\"c\",\"object\":\"text_completion\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":%d,\"text\":%q,\"logprobs\":null,\"finish_reason\":null}]}\n\n", i, prompts[i])
		fmt.Fprintf(&sse, "data: {\"id\":\"c\",\"object\":\"text_completion\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":%d,\"text\":%q,\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n", i, g)
	}
	sse.WriteString("data: [DONE]\n\n")
	writeFixture(t, dir, "echo_stream.sse", sse.String())
	h := newHarnessWithFixtures(t, dir, nil)
	u, key := h.user("standard")
	price := pricing.Price{Input: h.cfg.Models["fake-gpt"].Input.Micro, Output: h.cfg.Models["fake-gpt"].Output.Micro}

	cases := []struct {
		name, fixture, body string
		prompt, output      int64
	}{
		{"whole answer", "echo_whole.json", `{"model":"fake-gpt","echo":true,"max_tokens":20,"prompt":"` + p1 + `"}`,
			int64(len(p1)), int64(len(gen[0]))},
		{"echo not honoured", "echo_ignored.json", `{"model":"fake-gpt","echo":true,"max_tokens":300,"prompt":"` + p1 + `"}`,
			int64(len(p1)), int64(len(ignored))},
		{"stream of a batch, n=2", "echo_stream.sse", `{"model":"fake-gpt","echo":true,"stream":true,"n":2,"max_tokens":20,"prompt":["` + p1 + `","` + p2 + `"]}`,
			int64(len(p1) + len(p2)), int64(len(gen[0]) + len(gen[1]) + len(gen[2]) + len(gen[3]))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run, _ := h.answeredRun(u.ID, key, "/v1/completions", tc.body, map[string]string{fakellm.HeaderReplay: tc.fixture})
			want := pricing.Usage{Input: (tc.prompt + 3) / 4, Output: metering.EstimateOutputTokens(tc.output)}
			if run.Usage() != want || !run.Estimated || run.CostMicro != price.Cost(want) {
				t.Errorf("settled %+v (estimated %v) at %d µUSD, want %+v at %d µUSD: the echoed prompt is no output",
					run.Usage(), run.Estimated, run.CostMicro, want, price.Cost(want))
			}
		})
	}
	h.settled()
	var charged, used int64
	if err := h.db.Get(&charged, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ? AND state = 'settled'", u.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.db.Get(&used, "SELECT COALESCE(SUM(used_micro), 0) FROM usage_days WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if used != charged {
		t.Errorf("day ledger %d µUSD, settled rows %d", used, charged)
	}
}
