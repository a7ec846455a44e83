package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestNamedRunWhoseBudgetPaysThePromptButNoAnswerIsRunBudgetExhausted: a named run's call
// reserves its part of the run's budget (at least its prompt's cost), then its rewrite fits
// the answer in what was granted. A run whose budget pays the prompt but not one token of
// answer is refused by that rewrite, and the refusal is the run's (402 run_budget_exhausted,
// the run's cap), not a plain call's insufficient_credits: an agent that reads the code
// settles or reopens its run, not its account. The model here prices one output token above
// the whole run's cap, so any reservation granted leaves no room for an answer.
func TestNamedRunWhoseBudgetPaysThePromptButNoAnswerIsRunBudgetExhausted(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		m := c.Models["fake-gpt"]
		m.Output = config.USDPerM{Micro: 1_000_000_000} // 1 000 µUSD an output token
		c.Models["fake-gpt"] = m
		p := c.Plans["standard"]
		// 500 µUSD: the short prompt's few tokens at 2.50 USD/M fit, one answer token does not.
		p.MaxRunCostCredits, p.HoldNormalCredits, p.HoldHeavyCredits = config.Credits{Milli: 500}, config.Credits{Milli: 500}, config.Credits{Milli: 500}
		c.Plans["narrow"] = p
	})
	_, key := h.user("narrow")
	a := send(h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "narrow-run"})
	if a.status != http.StatusPaymentRequired || errorCode(t, a.body) != "run_budget_exhausted" {
		t.Errorf("named run's call whose run budget pays its prompt but no answer: %d %s; want 402 run_budget_exhausted",
			a.status, a.body)
	}
	h.settled()
}
