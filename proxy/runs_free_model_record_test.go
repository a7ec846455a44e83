package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestNamedRunOfAFreeModelRecordsItsCalls: a call of a free model (README: price `0` for a
// free model) costs nothing but uses tokens, and the run's row records it as a call that used
// something (tokens, calls), as the tally does. Recorded as a call that used nothing, a Redis
// restart before the settle left the run settled with its tokens but no calls.
func TestNamedRunOfAFreeModelRecordsItsCalls(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.Input, m.Output, m.CacheRead, m.CacheWrite = config.USDPerM{}, config.USDPerM{}, config.USDPerM{}, config.USDPerM{}
		c.Models["fake-gpt"] = m
	})
	u, key := h.user("standard")
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "free-task"}, 40)
	if r := h.run(u.ID, runID); r.CostMicro != 0 || r.OutTok != 40 || r.Calls != 1 || r.EndedCalls != 1 {
		t.Fatalf("run's row %+v: want the free call recorded as one call of 40 output tokens at cost 0", r)
	}
	loseRunKeys(t, h, runID)
	// Older than any call: a run without a tally is not busy for its first call's sake.
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if status, body := settleAfterRebuild(h, key, "free-task", runID); status != http.StatusOK {
		t.Fatalf("settle after the run's tally was lost: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.ChargedMicro != 0 || r.OutTok != 40 || r.Calls != 1 {
		t.Fatalf("settled run %+v: want its one call of 40 output tokens, charged 0", r)
	}
}
