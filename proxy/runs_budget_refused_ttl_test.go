package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestNamedRunRefusedAfterARedisRestartLeavesNoKeyForGood: after a Redis restart without
// persistence, a named run whose row records its whole cap has its next call refused 402
// run_budget_exhausted. The reservation that refuses it finds the run's tally (gone) short of
// the row's record and marks the run's budget hash so; written into no hash, that mark made
// one without a TTL, kept in Redis for good (README § Sizing Redis: every key lapses).
func TestNamedRunRefusedAfterARedisRestartLeavesNoKeyForGood(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	// The run's cap is what the user has: 1 000 µUSD, 100 output tokens of fake-gpt.
	allowance := int64(1_000)
	if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	run := map[string]string{"X-Run-Id": "task-spent"}
	runID := firstRunCall(t, h, key, run, 200) // as many tokens as the cap lets it have
	loseRunKeys(t, h, runID)
	second := send(h.gw.URL, key, chatBody, run)
	if second.status != http.StatusPaymentRequired || errorCode(t, second.body) != "run_budget_exhausted" {
		t.Fatalf("call after the restart: %d %s, want 402 run_budget_exhausted", second.status, second.body)
	}
	h.settled()
	hash := h.keys.RunBudget(runID)
	if h.rdb.Exists(context.Background(), hash).Val() == 0 {
		return
	}
	if tl := h.rdb.PTTL(context.Background(), hash).Val(); tl <= 0 || tl > 24*time.Hour {
		t.Fatalf("the run's budget hash, written by the refused call, lives %v: want it to lapse", tl)
	}
}
