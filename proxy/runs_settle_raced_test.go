package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestSettleThatFindsTheRunSettledIsNoHoldCharge: a named run without a tally or a record on
// its row, old enough to be charged its hold, is settled by someone else (the reconciler,
// another settle) as its settle on request closes it. That settle then applies nothing: it answers the settled run,
// counts its settlement as applied=false, and counts no hold charge
// (tollgate_reconcile_hold_total, "someone should look") — the charge was not its own.
func TestSettleThatFindsTheRunSettledIsNoHoldCharge(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := h.endedRunCall(t, key, "task-raced")
	if err := h.rdb.Del(context.Background(), h.keys.Usage(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
		cache_write_tok = 0, out_tok = 0, ended_calls = 0, created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	settledFirst := false
	// The other settlement charges the run from an empty tally, at 0: its row then records no
	// call either, and the settle on request, finding neither, goes on to charge the hold.
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		if step != "run close" {
			return
		}
		once.Do(func() {
			res, err := h.store.Settle(ctx, holds.Settlement{RunID: runID, Source: holds.SourceReconcile})
			if err != nil || !res.Applied {
				t.Errorf("the other settlement: %+v, %v; want applied", res, err)
				return
			}
			settledFirst = true
		})
	})
	status, body := h.settleRun(key, "task-raced")
	if !settledFirst {
		t.Fatal("the settle never came to close the run: the race was not made where the test means it")
	}
	if r := h.run(u.ID, runID); status != http.StatusOK || r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 0 {
		t.Fatalf("settle %d %s, run %+v: want 200 showing the run the other settlement settled", status, body, r)
	}
	if got := h.metric(`tollgate_settlements_total{applied="false",source="client"}`); got != "1" {
		t.Errorf("settlements on request that found the run settled: %q, want 1", got)
	}
	if got := h.metric("tollgate_reconcile_hold_total"); got != "0" {
		t.Errorf("hold charges counted by a settle that charged nothing: %q, want 0", got)
	}
}
