package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAttemptTheReconcilerSettledAtNoCostRunsAgainOnceRedisLostItsRecord: with its record
// lost, an attempt the reconciler settled by its tally is taken as pinned only if it cost
// something (attemptPinned). One whose tally shows nothing (its process killed before the
// provider's usage came) was not answered: its retry runs. Taken as pinned, the caller was told
// 409 idempotent_response_lost for an answer that never existed, and had to pay for a new key.
func TestIdemAttemptTheReconcilerSettledAtNoCostRunsAgainOnceRedisLostItsRecord(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "reconciled-at-no-cost"}
	firstRun := answeredThenReconciled(h, key, idem)
	// Its provider cost as such a tally leaves it (the charge is left as it was: the ledger
	// audit checks the books, and attemptPinned reads the cost alone).
	if _, err := h.db.Exec(`UPDATE run_holds SET cost_micro = 0 WHERE run_id = ?`, firstRun); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	all, err := h.rdb.Keys(ctx, h.keys.Prefix+"*").Result()
	if err != nil || len(all) == 0 {
		t.Fatalf("keys %v, %v", all, err)
	}
	if err := h.rdb.Del(ctx, all...).Err(); err != nil {
		t.Fatal(err)
	}
	b := send(h.gw.URL, key, chatBody, idem)
	h.settled()
	if b.status != http.StatusOK || b.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("retry of an attempt reconciled at no cost, its record lost: %d replayed=%q %s; want it run as a new attempt",
			b.status, b.header.Get(proxy.ReplayedHeader), b.body)
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
}
