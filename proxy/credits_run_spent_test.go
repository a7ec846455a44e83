package proxy_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/pricing"
)

// TestCreditsDuringANamedRunCountWhatItsCallsUsed: README, GET /v1/credits — "available" is
// what admission allows. An agent polls it between the calls of its run to decide whether to
// go on. A named run was counted at its hold until it settled, though its calls may spend up
// to its cap: "available" stood still while the calls spent past the hold, then fell at the
// settle. It now counts each run at what its calls have used when that is more than its hold
// ("spent_in_runs" says how much), and the settle moves nothing but "used_today".
func TestCreditsDuringANamedRunCountWhatItsCallsUsed(t *testing.T) {
	// used_today is read after the settle: on the midday clock both are one day's.
	h := newHarnessMidday(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.HoldNormalCredits, p.HoldHeavyCredits = config.Credits{Milli: 1}, config.Credits{Milli: 1} // 1 µUSD
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	cr := func(micro int64) json.Number { return json.Number(pricing.FormatCredits(micro, 1000)) }
	credits := func(when string) map[string]any {
		t.Helper()
		status, c := h.getExact(key, "/v1/credits")
		if status != http.StatusOK {
			t.Fatalf("credits %s: %d %v", when, status, c)
		}
		return c
	}

	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-spending"}, 5)
	spent := h.run(u.ID, runID).CostMicro
	if spent <= 1 {
		t.Fatalf("the run's call recorded %d µUSD: the test needs a call that costs more than its hold", spent)
	}
	during := credits("during the run")
	if during["held"] != cr(spent) || during["spent_in_runs"] != cr(spent) || during["available"] != cr(2_000_000-spent) ||
		during["used_today"] != cr(0) {
		t.Fatalf("credits during the run, its call having used %s: %v; want held and spent_in_runs %s, available %s",
			cr(spent), during, cr(spent), cr(2_000_000-spent))
	}

	if status, body := h.settleRun(key, "task-spending"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	after := credits("after the settle")
	if after["available"] != during["available"] || after["used_today"] != cr(spent) || after["held"] != cr(0) ||
		after["spent_in_runs"] != cr(0) {
		t.Fatalf("credits after the settle: %v; want available still %s, used_today %s, nothing held", after, during["available"], cr(spent))
	}
}
