package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemKeyFreeWhenItsRecordExpiredAfterALateSettlement: the key's record lives replay_ttl
// from its last write, the pin, made before the attempt settles; the attempt's row measured
// the window from settled_at. When settlement lagged the answer (it failed and the reconciler
// charged the hold at its expiry, or the process was killed after the answer), a retry sent
// once the record had expired but before settled_at + replay_ttl found no record, and the row
// said "pinned, inside the window": 409 idempotent_response_lost ("not run again") for as long
// as the lag, then it ran. The key expired; the caller was told its answer was lost.
//
// Timeline, by the database clock, replay_ttl 30 min: the attempt began and answered 31 min
// ago (its record expired a minute ago: deleted here, as Redis expires it), and its settlement
// landed 20 min after its answer, 11 min ago. The retry is a new request, run and charged.
func TestIdemKeyFreeWhenItsRecordExpiredAfterALateSettlement(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.ReplayTTL = 30 * time.Minute })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "late-settled-1"}
	a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()
	firstRun := a.header.Get(proxy.RunIDHeader)
	if _, err := h.db.Exec(`UPDATE run_holds SET created_at = created_at - INTERVAL 31 MINUTE,
		settled_at = settled_at - INTERVAL 11 MINUTE WHERE run_id = ?`, firstRun); err != nil {
		t.Fatal(err)
	}
	// The ledger's day follows settled_at (the audit at cleanup checks it).
	if _, err := h.db.Exec(`UPDATE usage_days d JOIN run_holds h ON h.user_id = d.user_id AND h.run_id = ?
		SET d.day = DATE(h.settled_at)`, firstRun); err != nil {
		t.Fatal(err)
	}
	// replay_ttl since the pin has passed
	if err := h.rdb.Del(context.Background(), onlyIdemRecord(h)).Err(); err != nil {
		t.Fatal(err)
	}

	retryRunsAgain(h, key, idem, u.ID, firstRun, "retry after the record expired (replay_ttl since the answer), the attempt settled late")
}

// TestIdemAttemptTheReconcilerSettledIsNotRunAgainOnceRedisLostItsRecord: an attempt that
// pinned its key (its whole answer sent) and was then settled by the reconciler (its process
// killed after the answer, or its settlement failed) has a row that says `reconcile`, as a
// killed attempt cut mid-answer does. With the record there, its answer is replayed; with the
// record lost whole (a Redis restart without persistence) inside replay_ttl, the row alone
// cannot tell, and the retry ran and was charged a second time. It is refused 409
// idempotent_response_lost now, every time, and the upstream is called once.
func TestIdemAttemptTheReconcilerSettledIsNotRunAgainOnceRedisLostItsRecord(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "reconciled-then-lost"}
	firstRun := answeredThenReconciled(h, key, idem)
	ctx := context.Background()
	// Redis restarted without persistence: every key of this gateway's gone (the test's own
	// prefix; other tests share the server).
	all, err := h.rdb.Keys(ctx, h.keys.Prefix+"*").Result()
	if err != nil || len(all) == 0 {
		t.Fatalf("keys %v, %v", all, err)
	}
	if err := h.rdb.Del(ctx, all...).Err(); err != nil {
		t.Fatal(err)
	}
	// Every retry, not only the first: none may leave a record the next takes for the
	// attempt's own (one without an answer: not pinned).
	for i := range 2 {
		b := send(h.gw.URL, key, chatBody, idem)
		h.settled()
		if b.status != http.StatusConflict || errorCode(t, []byte(b.body)) != "idempotent_response_lost" {
			t.Fatalf("retry %d of a pinned attempt the reconciler settled, its record lost: %d %s; want 409 idempotent_response_lost",
				i, b.status, b.body)
		}
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1: the pinned attempt ran again", n)
	}
	h.expectCharges(u.ID, []string{firstRun})
}

// TestIdemAttemptTheReconcilerSettledRunsAgainWhileItsRecordSaysItDidNotPin: the other side
// of the rule above. An attempt cut mid-answer (its process killed) is settled by the
// reconciler too, and its record, still in Redis, holds no answer: it did not pin the key,
// and its retry runs as the next attempt.
func TestIdemAttemptTheReconcilerSettledRunsAgainWhileItsRecordSaysItDidNotPin(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "reconciled-unpinned"}
	firstRun := answeredThenReconciled(h, key, idem)
	// The record as a killed attempt leaves it: its body and attempt, no answer.
	if err := h.rdb.HDel(context.Background(), onlyIdemRecord(h), "run").Err(); err != nil {
		t.Fatal(err)
	}
	retryRunsAgain(h, key, idem, u.ID, firstRun, "retry of an attempt cut before it pinned")
}

// answeredThenReconciled sends one Idempotency-Key call, answered whole, and leaves its row as
// the reconciler would have settled it (the same charge, source reconcile); it returns the run.
func answeredThenReconciled(h *harness, key string, idem map[string]string) string {
	h.t.Helper()
	a := sendOK(h.t, "first", h.gw.URL, key, chatBody, idem)
	h.settled()
	runID := a.header.Get(proxy.RunIDHeader)
	if _, err := h.db.Exec(`UPDATE run_holds SET settle_source = 'reconcile' WHERE run_id = ?`, runID); err != nil {
		h.t.Fatal(err)
	}
	return runID
}

// onlyIdemRecord is the Redis key of the gateway's one Idempotency-Key record.
func onlyIdemRecord(h *harness) string {
	h.t.Helper()
	recs, err := h.rdb.Keys(context.Background(), h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != 1 {
		h.t.Fatalf("idempotency records %v, %v; want one", recs, err)
	}
	return recs[0]
}

// retryRunsAgain sends the key's request again and checks it ran as a new attempt (not a
// replay): a second upstream call, both runs charged.
func retryRunsAgain(h *harness, key string, idem map[string]string, userID uint64, firstRun, what string) {
	h.t.Helper()
	b := send(h.gw.URL, key, chatBody, idem)
	h.settled()
	if b.status != http.StatusOK || b.header.Get(proxy.ReplayedHeader) != "" {
		h.t.Fatalf("%s: %d replayed=%q %s; want it run as a new attempt", what, b.status, b.header.Get(proxy.ReplayedHeader), b.body)
	}
	if n := h.fake.Calls(); n != 2 {
		h.t.Fatalf("%d upstream calls, want 2", n)
	}
	h.expectCharges(userID, []string{firstRun, b.header.Get(proxy.RunIDHeader)})
}
