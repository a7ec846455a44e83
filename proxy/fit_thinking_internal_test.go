package proxy

import (
	"strconv"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/metering"
)

// TestFitThinkingKeepsTheBudgetBelowTheLoweredBound: Anthropic refuses an extended-thinking
// request whose budget_tokens is not below max_tokens, and one whose budget_tokens is below
// 1 024. Once max_tokens is lowered to limit, a budget of limit or more is lowered to limit-1
// (a budget equal to limit was forwarded as it was: a 400 about a max_tokens the caller never
// sent); a limit that leaves less than 1 024 for it is a budget too small (402), and one that
// leaves exactly 1 024 is forwarded.
func TestFitThinkingKeepsTheBudgetBelowTheLoweredBound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
		limit  int64
		ok     bool
		want   int64 // the budget forwarded
	}{
		{"a budget below the bound is left alone", 1999, 2000, true, 1999},
		{"a budget equal to the bound is lowered below it", 2000, 2000, true, 1999},
		{"a budget above the bound is lowered below it", 5000, 2000, true, 1999},
		{"a bound leaving exactly the least budget", 5000, minThinkingBudget + 1, true, minThinkingBudget},
		{"a bound leaving less than the least budget", 5000, minThinkingBudget, false, 5000},
	} {
		c := &callRequest{route: &route{format: metering.FormatAnthropic},
			body: []byte(`{"model":"claude-test","max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":` +
				strconv.FormatInt(tc.budget, 10) + `}}`)}
		ok, err := c.fitThinking(tc.limit)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := gjson.GetBytes(c.body, "thinking.budget_tokens").Int(); ok != tc.ok || got != tc.want {
			t.Errorf("%s: ok %v, budget_tokens %d; want ok %v, %d", tc.name, ok, got, tc.ok, tc.want)
		}
	}
}
