package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAttemptPausedWhileARetryWasRefusedItsNextAttemptIsNotForwarded: as
// TestIdemAttemptPausedWhileARetryFailedTheKeyIsNotForwarded, but the caller's retry during the
// pause, having found the stopped attempt settled and moved the key's counter past it, is refused
// at its own admission (402: the user, charged the stopped attempt's hold, has nothing left at
// that moment): the key's next attempt has no row, and laterAttempt finds nothing. Only the
// record's counter, read by the resumed attempt's claim (claimForwardScript), says the key has
// moved on: the attempt is not forwarded, its caller is told 409 request_in_progress naming the
// next attempt, its charge is given back whole, and the caller's retry once it has credits again
// runs that next attempt: one upstream call for the key, charged once. Mutant: the claim ignores
// the counter (`a > ARGV[2]`) — the resumed attempt was forwarded and answered, its answer stored
// nowhere (the counter had moved on), and the retry ran the key again: two upstream calls, two
// charges.
func TestIdemAttemptPausedWhileARetryWasRefusedItsNextAttemptIsNotForwarded(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	ctx := context.Background()
	const idemKey = "paused-retry-refused"
	idem := map[string]string{proxy.IdempotencyKeyHeader: idemKey}
	attempt1 := proxy.IdempotentRunID(u.ID, idemKey, 1)
	attempt2 := proxy.IdempotentRunID(u.ID, idemKey, 2)
	if refused := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503")); refused.status < 500 {
		t.Fatalf("the first attempt, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	calls := h.fake.Calls()
	p := pauseAttempt(t, h, key, idem)
	if st := h.reconcileExpired(t, "run_id = ?", attempt1); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}

	zero := int64(0)
	if err := h.store.SetUserLimits(ctx, u.ID, &zero, nil, nil); err != nil {
		t.Fatal(err)
	}
	broke := send(h.gw.URL, key, chatBody, idem)
	if broke.status != http.StatusPaymentRequired || errorCode(t, broke.body) != "insufficient_credits" {
		t.Fatalf("retry once the paused attempt was charged, the user out of credits: %d %s; want 402 insufficient_credits",
			broke.status, broke.body)
	}
	record := h.keys.Replay(proxy.IdempotentRunID(u.ID, idemKey, 0))
	if n, err := h.rdb.HGet(ctx, record, "attempt").Int(); err != nil || n != 2 {
		t.Fatalf("the key's counter after the refused retry: %d (%v); want 2, moved past the paused attempt", n, err)
	}
	if _, err := h.store.Run(ctx, u.ID, attempt2); err == nil {
		t.Fatalf("the refused retry left a row for %s; want none (laterAttempt must find nothing)", attempt2)
	}
	if err := h.store.ChangeUser(ctx, u.ID, holds.UserChange{Allowance: holds.Override[int64]{Clear: true}}); err != nil {
		t.Fatal(err)
	}

	first := p.answerAfter(t, holdTTL)
	h.settled()
	checkResumedAttemptGaveWay(t, h, first, calls, attempt2)
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != attempt2 || ran.header.Get(proxy.ReplayedHeader) != "" {
		t.Errorf("retry once the user has credits again: %d %s (run %q, replayed %q); want the key's next attempt %s run",
			ran.status, ran.body, ran.header.Get(proxy.RunIDHeader), ran.header.Get(proxy.ReplayedHeader), attempt2)
	}
	h.settled()
	if n := h.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls for the key past its first attempt, want 1: the key ran twice", n)
	}
	checkKeyAnsweredOnceAfterItsPause(t, h, u.ID, key, idem, ran, attempt1, attempt2)
}
