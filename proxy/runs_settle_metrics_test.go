package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestFailedRunSettleIsCountedAndNotAsAHoldCharge: a settle on request (POST
// /v1/runs/{id}/settle) that gives up with the database out of reach is a settlement failure
// (tollgate_settle_failures_total, the alert for runs left to the reconciler), and it charged
// nothing, so it is no charge at the hold (tollgate_reconcile_hold_total). The failure went
// uncounted, while a tally-less run's hold charge was counted before its settlement was even
// tried: once per attempt, a failed one included.
func TestFailedRunSettleIsCountedAndNotAsAHoldCharge(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-unsettled"})
	readAll(t, resp.Body)
	resp.Body.Close()
	runID := resp.Header.Get(proxy.RunIDHeader)
	h.settled()
	// The run's evidence is lost (tally and row record), and it is older than any call: its
	// settlement charges its hold.
	if err := h.rdb.Del(context.Background(), h.keys.Usage(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
		cache_write_tok = 0, out_tok = 0, ended_calls = 0, created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}

	lossy.Arm("SELECT run_id, user_id FROM run_holds WHERE run_id IN", testenv.GoDown)
	status, body := h.settleRun(key, "task-unsettled")
	lossy.Restore()
	if status != http.StatusServiceUnavailable {
		t.Fatalf("settle with the database down: %d %s, want 503", status, body)
	}
	if got := h.metric("tollgate_settle_failures_total"); got != "1" {
		t.Errorf("settle failures after the failed settle: %q, want 1", got)
	}
	if got := h.metric("tollgate_reconcile_hold_total"); got != "0" {
		t.Errorf("hold charges after a settle that charged nothing: %q, want 0", got)
	}

	if status, body := h.settleRun(key, "task-unsettled"); status != http.StatusOK {
		t.Fatalf("settle once the database is back: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.ChargedMicro != r.HeldMicro {
		t.Fatalf("run %+v: want charged its hold", r)
	}
	if got := h.metric("tollgate_reconcile_hold_total"); got != "1" {
		t.Errorf("hold charges after the settle that charged the hold: %q, want 1", got)
	}
}
