package proxy_test

import (
	"context"
	"net/http"
	"testing"
)

// TestNamedRunBudgetSurvivesARedisRestart: a named run's calls share its cap through a budget
// kept in Redis (what the run has tallied, what its calls in flight reserved). A Redis restart
// without persistence lost the tally, and the run's next calls were given the whole cap
// again: the run's calls then cost more than its cap, and the charge, clamped to the cap, left
// the difference to whoever pays the provider. The run's row records every ended call (what
// a settlement charges after such a restart), and a call's reservation counts that record as
// spent too.
func TestNamedRunBudgetSurvivesARedisRestart(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	// The run's cap is what the user has: 1 000 µUSD, 100 output tokens of fake-gpt.
	allowance := int64(1_000)
	if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	// ~600 of the 1 000, then a call that asks for up to 80 tokens: about 35 are left under
	// the cap (the gateway lowers a request's max_tokens to what its budget covers).
	runID := callsAcrossARedisRestartWith(t, h, key, "task-capped", 60,
		`{"model":"fake-gpt","max_tokens":80,"messages":[{"role":"user","content":"go on"}]}`, 80)
	if status, body := settleAfterRebuild(h, key, "task-capped", runID); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.CapMicro != allowance || r.Calls != 2 {
		t.Fatalf("run %+v: want 2 calls under a cap of %d", r, allowance)
	}
	if r.CostMicro > r.CapMicro {
		t.Fatalf("the run's calls cost %d (%d output tokens) over its cap of %d: the call after the restart was given the whole cap again",
			r.CostMicro, r.OutTok, r.CapMicro)
	}
}
