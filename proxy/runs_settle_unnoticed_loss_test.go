package proxy_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestSettleBetweenACallsTallyAndItsRecordAfterAnUnnoticedRedisLoss: README, "a named run's
// budget counts what its row records (its ended calls)" after a Redis restart without
// persistence, and "while a call of the run is in flight, POST …/settle gets 409 run_busy".
// A run's first call (5 output tokens) ended and was recorded on its row; Redis then lost the
// run's keys — before its second call (40 tokens) was admitted, or while it ran — and no
// settle had noticed the loss yet (no lost mark). A settle sent between the second call's
// tally and its record on the row found a tally of one call costing more than the row's one
// call, took the tally as whole, found nothing in flight (the call's record-to-come mark is
// set only on a run known to have lost calls) and charged the second call alone; the second
// call's record then found its run settled. The chaos test's seed 1796283170198021605 hit it:
// a run charged 1 call of the 2 its agent saw complete.
func TestSettleBetweenACallsTallyAndItsRecordAfterAnUnnoticedRedisLoss(t *testing.T) {
	for _, when := range []string{"between the calls", "during the second call"} {
		t.Run(when, func(t *testing.T) {
			h, gate := gatedHarness(t, nil)
			u, key := h.user("standard")
			name := "task-unnoticed-" + strings.ReplaceAll(when, " ", "-")
			run := map[string]string{"X-Run-Id": name}
			runID := firstRunCall(t, h, key, run, 5)
			if when == "between the calls" {
				loseRunKeys(t, h, runID)
			}
			second, tx, letGo := streamWithRunRowLocked(t, h, gate, key, run, runID)
			defer second.Body.Close()
			defer tx.Rollback()
			if when == "during the second call" {
				// Its reservation goes with the rest; the harness writes no lease.
				loseRunKeys(t, h, runID)
			}
			letGo()
			settleInRecordWindow(t, h, key, name, runID, second, tx)
			r := h.run(u.ID, runID)
			if r.State != holds.StateSettled || r.OutTok != 45 || r.Calls != 2 {
				t.Fatalf("run settled as %s with %d output tokens over %d calls, charged %d µUSD; want both calls (45 output tokens)",
					r.State, r.OutTok, r.Calls, r.ChargedMicro)
			}
		})
	}
}
