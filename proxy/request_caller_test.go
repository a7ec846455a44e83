package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestCompletionsPromptBatchIsBoundedByTheCap: /v1/completions takes a batch of prompts (an
// array of strings, or of token arrays) and answers each of them, every answer up to
// max_tokens (times n / best_of). The rewrite must bound the whole batch by the cap, as it does
// n choices; bounding one answer let a batch of eight run eight times what its cap pays for,
// the rest served and clamped away at settlement. A single token array is one prompt.
func TestCompletionsPromptBatchIsBoundedByTheCap(t *testing.T) {
	h, up := jsonHarness(t)
	_, key := h.user("standard")
	// Default cap 500 credits = 500 000 µUSD; fake-gpt output is 10 µUSD a token.
	const capTokens = 50_000
	cases := []struct {
		name, body string
		prompts    int64
	}{
		{"strings", `{"model":"fake-gpt","max_tokens":90000000,"prompt":["a","b","c","d","e","f","g","h"]}`, 8},
		{"token arrays", `{"model":"fake-gpt","max_tokens":90000000,"prompt":[[1,2],[3],[4],[5]]}`, 4},
		{"with best_of", `{"model":"fake-gpt","max_tokens":90000000,"best_of":3,"prompt":["a","b"]}`, 2},
		{"one token array", `{"model":"fake-gpt","max_tokens":90000000,"prompt":[1,2,3,4,5,6,7,8,9]}`, 1},
		// A provider that folds case (Go's encoding/json) reads "Prompt" as the prompt.
		{"Prompt in another case", `{"model":"fake-gpt","max_tokens":90000000,"Prompt":["a","b","c","d","e","f","g","h"]}`, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, "/v1/completions", tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				errorCode(t, body)
				return // refused: fine
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d %s", resp.StatusCode, body)
			}
			sent := up.last(t)
			answers := max(int64(1), sent.Get("n").Int(), sent.Get("best_of").Int()) * tc.prompts
			got := sent.Get("max_tokens").Int()
			if got*answers > capTokens {
				t.Errorf("upstream got max_tokens=%d for %d answers: up to %d output tokens, the cap pays for %d",
					got, answers, got*answers, capTokens)
			}
			if tc.prompts == 1 && got*answers < capTokens/2 {
				t.Errorf("a single token array was bounded as a batch: max_tokens=%d", got)
			}
		})
	}
}

// TestNullStreamIsNotAStream: OpenAI's API takes "stream": null as its default, false, as the
// gateway takes a null max_tokens or n; clients that write every optional field (null when
// unset) must not be refused with 400 invalid_stream.
func TestNullStreamIsNotAStream(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	r, _ := h.answeredRun(u.ID, key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":null,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if r.ChargedMicro <= 0 {
		t.Fatalf("answered call charged %d", r.ChargedMicro)
	}
}

// TestResponsesBoundBelowItsMinimumIsABudgetTooSmall: the Responses API refuses
// max_output_tokens below 16 (400 integer_below_min_value). A call whose cap pays for fewer
// output tokens than that was forwarded with such a bound and got the provider's 400 about a
// field the caller never sent; it is a budget too small for any answer: 402, nothing forwarded.
func TestResponsesBoundBelowItsMinimumIsABudgetTooSmall(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.MaxOutputTokens = 100_000 // a bound is added to a request that sets none
		c.Models["fake-gpt-limited"] = m
	})
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	price, _, _ := table.Lookup("fake-gpt")
	for _, body := range []string{
		`{"model":"fake-gpt","input":"hi","max_output_tokens":1000}`, // the caller's bound lowered
		`{"model":"fake-gpt-limited","input":"hi"}`,                  // a bound added
	} {
		u, key := h.user("standard")
		in, _ := metering.EstimatePrompt(metering.FormatResponses, []byte(body))
		prompt := price.Cost(pricing.Usage{Input: in})
		allowance := prompt + 10*price.Output/1_000_000 // ten output tokens
		if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
			t.Fatal(err)
		}
		before := h.fake.Calls()
		resp := h.post(key, "/v1/responses", body, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusPaymentRequired || h.fake.Calls() != before {
			t.Errorf("%s: %d %s (upstream calls %d), want 402 and nothing forwarded", body, resp.StatusCode, answer, h.fake.Calls()-before)
		}
	}
}

// TestUnboundedCallWhoseCapPaysNoAnswerIs402: README "Errors": 402 insufficient_credits when
// what is available does not pay for the prompt and the least answer (1 output token; 16 on
// /v1/responses). A call that sets no output bound, for a model whose own limit is not
// configured, was forwarded unbounded whatever its cap left for the answer: a caller whose
// credits paid for the prompt alone was served, its answer clamped away at settlement (the
// operator paid for it). It is refused as a bounded call is: 402, nothing forwarded, nothing
// held or charged.
func TestUnboundedCallWhoseCapPaysNoAnswerIs402(t *testing.T) {
	h := newHarness(t, nil)
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	price, _, _ := table.Lookup("fake-gpt")
	perToken := price.Output / 1_000_000
	for _, tc := range []struct {
		name, path, body string
		format           metering.Format
		left             int64  // what the allowance pays for beyond the prompt
		run              string // X-Run-Id, if any
		code             string
	}{
		{"chat, half a token", "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`,
			metering.FormatChat, perToken / 2, "", "insufficient_credits"},
		{"chat, one token for two answers", "/v1/chat/completions", `{"model":"fake-gpt","n":2,"messages":[{"role":"user","content":"hi"}]}`,
			metering.FormatChat, perToken + perToken/2, "", "insufficient_credits"},
		{"responses, fewer than 16", "/v1/responses", `{"model":"fake-gpt","input":"hi"}`, metering.FormatResponses, 10 * perToken,
			"", "insufficient_credits"},
		// A named run's call reserves at least its prompt's cost, which fits; no answer does.
		{"named run, half a token", "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`,
			metering.FormatChat, perToken / 2, "agent", "run_budget_exhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, key := h.user("standard")
			in, _ := metering.EstimatePrompt(tc.format, []byte(tc.body))
			allowance := price.Cost(pricing.Usage{Input: in}) + tc.left
			if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
				t.Fatal(err)
			}
			var hdr map[string]string
			if tc.run != "" {
				hdr = map[string]string{"X-Run-Id": tc.run}
			}
			before := h.fake.Calls()
			resp := h.post(key, tc.path, tc.body, hdr)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusPaymentRequired || h.fake.Calls() != before {
				t.Fatalf("%d %s (upstream calls %d), want 402 and nothing forwarded", resp.StatusCode, answer, h.fake.Calls()-before)
			}
			if code := errorCode(t, answer); code != tc.code {
				t.Errorf("code %s, want %s", code, tc.code)
			}
			// The prompt fits: the refusal must not tell the caller it does not.
			if msg := errorMessage(t, answer); !strings.Contains(msg, "least answer") {
				t.Errorf("message %q does not say the least answer is what does not fit", msg)
			}
			h.settled()
			if tc.run != "" {
				// The run stays open for the agent; settled, it is charged nothing.
				if status, body := h.settleRun(key, tc.run); status != http.StatusOK {
					t.Fatalf("settle %s: %d %s", tc.run, status, body)
				}
			}
			var left struct {
				Live    int   `db:"live"`
				Charged int64 `db:"charged"`
			}
			if err := h.db.Get(&left, `SELECT COALESCE(SUM(state <> 'settled'), 0) AS live, COALESCE(SUM(charged_micro), 0) AS charged
				FROM run_holds WHERE user_id = ?`, u.ID); err != nil {
				t.Fatal(err)
			}
			if left.Live != 0 || left.Charged != 0 {
				t.Errorf("%d holds left live, %d charged; want none, 0", left.Live, left.Charged)
			}
		})
	}
}
