package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// lossyPausedIdemHarness is pausedIdemHarness on a database reached through a Lossy network.
func lossyPausedIdemHarness(t *testing.T) (*harness, *testenv.Lossy) {
	t.Helper()
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	return newHarnessOn(t, harnessSetup{db: db}, pausedIdemSettings), lossy
}

// TestIdemPausedAttemptWhoseNextAttemptIsUnreadableIsRefusedAsLate: an attempt stopped at its
// admission and charged by the peer's reconciler resumes, and the read of its key's next
// attempt's row (laterAttempt) loses its reply. Whether a retry has run the key since is not
// known: the attempt is not forwarded, its caller is answered 503 billing_unavailable (retry),
// its charge is given back whole, and the retry runs the key once.
func TestIdemPausedAttemptWhoseNextAttemptIsUnreadableIsRefusedAsLate(t *testing.T) {
	h, lossy := lossyPausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-next-unreadable"}
	attempt1, attempt2 := h.idemRun(key, idem, 1), h.idemRun(key, idem, 2)
	p := pausedAttemptCharged(t, h, key, idem)
	calls := h.fake.Calls()
	lossy.Arm("FROM run_holds WHERE run_id = '"+attempt2+"'", testenv.LoseReply)
	first := p.answerAfter(t, pausedIdemHoldTTL)
	if !lossy.Fired() {
		t.Fatal("the read of the next attempt's row was never made")
	}
	if first.status != http.StatusServiceUnavailable || errorCode(t, first.body) != "billing_unavailable" {
		t.Errorf("the paused attempt's caller, resumed: %d %s; want 503 billing_unavailable", first.status, first.body)
	}
	h.settled()
	if n := h.fake.Calls() - calls; n != 0 {
		t.Errorf("the paused attempt was forwarded (%d upstream calls), want 0", n)
	}
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.ChargedMicro <= 0 || refunded != paused.ChargedMicro {
		t.Errorf("paused attempt charged %d, %d given back; want all of it given back: it was never forwarded", paused.ChargedMicro, refunded)
	}
	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusOK || retry.header.Get(proxy.RunIDHeader) != attempt2 {
		t.Errorf("retry: %d %s (run %q); want the key's next attempt (%s) run", retry.status, retry.body, retry.header.Get(proxy.RunIDHeader), attempt2)
	}
	if n := h.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls for the key past attempt 0, want the retry's alone", n)
	}
}

// TestIdemPauseRefundUnreadableIsBillingUnavailable: as
// TestIdemOvertakenAttemptRefundedWholeIsPassedOnceRedisLostTheRecord, but the retry's read of
// the overtaken attempt's pause refund (attemptPinned) loses its reply: whether the attempt
// may have answered is not known, and the retry is answered 503 billing_unavailable, nothing
// held nor forwarded. The next retry, the database answering, runs the key.
func TestIdemPauseRefundUnreadableIsBillingUnavailable(t *testing.T) {
	h, lossy := lossyPausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "pause-refund-unreadable"}
	p := pausedAttemptCharged(t, h, key, idem)
	if failed := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503")); failed.status < 500 {
		t.Fatalf("retry once the paused attempt was charged, refused by its upstream: %d %s", failed.status, failed.body)
	}
	if first := p.answerAfter(t, pausedIdemHoldTTL); first.status != http.StatusConflict {
		t.Fatalf("the paused attempt's caller, resumed: %d %s; want 409 (overtaken)", first.status, first.body)
	}
	h.settled()
	loseRecord(t, h, key, idem)
	runs, calls := h.runsOf(u.ID), h.fake.Calls()
	lossy.Arm("SELECT amount_micro, reason FROM grants", testenv.LoseReply)
	retry := send(h.gw.URL, key, chatBody, idem)
	if !lossy.Fired() {
		t.Fatal("the read of the pause refund was never made")
	}
	if retry.status != http.StatusServiceUnavailable || errorCode(t, retry.body) != "billing_unavailable" {
		t.Errorf("retry, the pause refund unreadable: %d %s; want 503 billing_unavailable", retry.status, retry.body)
	}
	h.settled()
	if n, m := h.runsOf(u.ID)-runs, h.fake.Calls()-calls; n != 0 || m != 0 {
		t.Errorf("retry, the pause refund unreadable: %d runs admitted, %d upstream calls; want none", n, m)
	}
	again := send(h.gw.URL, key, chatBody, idem)
	if again.status != http.StatusOK || again.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, 3) {
		t.Errorf("next retry: %d %s (run %q); want the key's next attempt (3) run", again.status, again.body, again.header.Get(proxy.RunIDHeader))
	}
}
