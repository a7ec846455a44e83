package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// Two attempts of one key stopped at their admission (as pausedAttempt: SIGSTOP, a VM's live
// migration), each charged its hold by the peer's reconciler: attempt 1, then attempt 2, which
// the caller's retry ran once it found attempt 1 settled. While both are stopped, Redis loses
// the key's record (a restart without persistence, an eviction, a failover), attempt counter
// and all. One of them resumes, finds the key still its own (the record it writes anew names
// no other attempt) and is forwarded under its mark; the other resumes after it. The mark is
// all that says the first is being forwarded: the counter that told the attempts apart is
// gone, and the forwarded attempt's row says what a killed process's would (reconcile_hold,
// the record there).

// lostUnderTwoPausedAttempts plays that scene up to the resumes: attempt 0 refused by its
// upstream (the record written, its counter at 1), attempt 1 stopped (its caller sending hdr1
// under ctx), attempt 2 stopped (hdr2), both charged their holds, the record deleted. It
// returns the two stopped attempts, and the upstream's calls so far.
func lostUnderTwoPausedAttempts(t *testing.T, h *harness, gate *gateUpstream, ctx context.Context, key string, idem, hdr1, hdr2 map[string]string) (
	first, second *pausedAttempt, calls int64) {
	t.Helper()
	if refused := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503")); refused.status < 500 {
		t.Fatalf("attempt 0, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	reached, resume := h.holdAtFirst("attempt admitted")
	first = &pausedAttempt{done: make(chan answer, 1), resume: resume, sent: time.Now()}
	go func() { first.done <- sendToCtx(ctx, h.gw.URL, "/v1/chat/completions", key, chatBody, hdr1) }()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("attempt 1 never reached its admission")
	}
	if st := h.reconcileExpired(t, "run_id = ?", h.idemRun(key, idem, 1)); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of attempt 1: %+v; want its hold charged (no tally)", st)
	}
	second = pauseAttempt(t, h, key, hdr2) // the retry, past attempt 1
	if st := h.reconcileExpired(t, "run_id = ?", h.idemRun(key, idem, 2)); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of attempt 2: %+v; want its hold charged (no tally)", st)
	}
	loseRecord(t, h, key, idem)
	return first, second, gate.fake.Calls()
}

// resumeAfter resumes p once it, and every attempt sent before it, has been stopped past its
// hold's life (as it must have been for a reconciler to charge it).
func (p *pausedAttempt) resumeAfter(h *harness) {
	time.Sleep(time.Until(p.sent.Add(h.cfg.Holds.HoldTTL + 100*time.Millisecond)))
	p.resume()
}

// endedAt waits until the next call to reach step "settle" has reached it (an Idempotency-Key
// attempt's end is recorded before its settlement) after start, which resumes it.
func endedAt(t *testing.T, h *harness, what string, start func()) {
	t.Helper()
	ended, settle := h.holdAtFirst("settle")
	start()
	select {
	case <-ended:
		settle()
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never ended once resumed", what)
	}
}

// TestIdemEarlierAttemptsEndKeepsALaterAttemptsMark: attempt 2 resumes first and is forwarded
// under its mark; attempt 1's caller left during the pause, so attempt 1, resumed, is not
// forwarded, and its end moves the key past it. That end dropped attempt 2's mark: the
// counter, lost, no longer said the key had moved past attempt 1, and its end took the key for
// its own. The retry then found attempt 2 settled, unmarked, moved past it and ran attempt 3
// beside it: two upstream calls, two charges for one key. An attempt's end drops no mark but
// its own.
func TestIdemEarlierAttemptsEndKeepsALaterAttemptsMark(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "lost-record-earlier-end"}
	t.Cleanup(func() { gate.open("second") })
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	first, second, calls := lostUnderTwoPausedAttempts(t, h, gate, ctx, key, idem, idem, with(idem, "X-Test-Gate", "second"))
	second.resumeAfter(h)
	gate.await(t, "second", 1) // attempt 2 forwarded: its answer held open at the upstream
	leave()
	<-first.done
	endedAt(t, h, "attempt 1", first.resume)

	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "request_in_progress" {
		t.Errorf("retry while attempt 2 is forwarded: %d %s (run %q); want 409 request_in_progress",
			retry.status, retry.body, retry.header.Get(proxy.RunIDHeader))
	}
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls answered while attempt 2's is held open, want 0: the retry ran the key again", n)
	}
	gate.open("second")
	answered := second.answerOf(t)
	if answered.status != http.StatusOK || answered.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, 2) {
		t.Fatalf("attempt 2's caller: %d %s (run %q); want the answer it paid for", answered.status, answered.body,
			answered.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	replayedOnce(t, h, gate, key, idem, answered, calls)
	if paused := h.run(u.ID, h.idemRun(key, idem, 1)); chargedRuns(t, h, u.ID) != 2 || grantedTo(t, h, u.ID) <= paused.ChargedMicro {
		t.Errorf("%d runs charged, %d given back (attempt 1 charged %d); want attempts 1 (all given back) and 2 alone",
			chargedRuns(t, h, u.ID), grantedTo(t, h, u.ID), paused.ChargedMicro)
	}
}

// secondAnswersOnceTheFirstGivenBack lets attempt 2's answer through the gate ("second") and
// checks that its caller is answered the answer it paid for, replayed to the retry with no
// upstream call beside it, and that attempt 1's charge was given back whole and part of
// attempt 2's (what it did not use of its hold).
func secondAnswersOnceTheFirstGivenBack(t *testing.T, h *harness, gate *gateUpstream, userID uint64, key string, idem map[string]string,
	second *pausedAttempt, calls int64) {
	t.Helper()
	attempt1, attempt2 := h.idemRun(key, idem, 1), h.idemRun(key, idem, 2)
	gate.open("second")
	answered := second.answerOf(t)
	if answered.status != http.StatusOK || answered.header.Get(proxy.RunIDHeader) != attempt2 {
		t.Fatalf("attempt 2's caller: %d %s (run %q); want the answer it paid for", answered.status, answered.body,
			answered.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	replayedOnce(t, h, gate, key, idem, answered, calls)
	paused, forwarded := h.run(userID, attempt1), h.run(userID, attempt2)
	if refunded := grantedTo(t, h, userID); refunded <= paused.ChargedMicro || refunded >= paused.ChargedMicro+forwarded.ChargedMicro {
		t.Errorf("attempt 1 charged %d, attempt 2 %d, %d given back; want all of attempt 1's given back and part of attempt 2's",
			paused.ChargedMicro, forwarded.ChargedMicro, refunded)
	}
}

// pausedAttemptCharged plays the scene most lost-record tests start from: attempt 0 refused by
// its upstream (the key's record written, its counter at 1), then attempt 1 stopped at its
// admission and charged its hold by a peer's reconciler (no tally). It returns attempt 1.
func pausedAttemptCharged(t *testing.T, h *harness, key string, idem map[string]string) *pausedAttempt {
	t.Helper()
	if refused := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503")); refused.status < 500 {
		t.Fatalf("attempt 0, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	p := pauseAttempt(t, h, key, idem)
	if st := h.reconcileExpired(t, "run_id = ?", h.idemRun(key, idem, 1)); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	return p
}

// loseRecord deletes the key's record, as a Redis restart without persistence, an eviction
// or a failover loses it.
func loseRecord(t *testing.T, h *harness, key string, idem map[string]string) {
	t.Helper()
	if err := h.rdb.Del(context.Background(), h.keys.Replay(h.idemRun(key, idem, 0))).Err(); err != nil {
		t.Fatal(err)
	}
}

// answeredAfterItsPause plays attempt 1 of the key stopped at its admission and charged its
// hold by a peer's reconciler, then resumed, forwarded and answered (pausedAttemptCharged),
// and returns its run once settled.
func answeredAfterItsPause(t *testing.T, h *harness, holdTTL time.Duration, userID uint64, key string, idem map[string]string) holds.Run {
	t.Helper()
	attempt1 := h.idemRun(key, idem, 1)
	first := pausedAttemptCharged(t, h, key, idem).answerAfter(t, holdTTL)
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Fatalf("the paused attempt's caller, resumed: %d %s; want the answer it paid for", first.status, first.body)
	}
	h.settled()
	return h.run(userID, attempt1)
}

// retryIsResponseLostOnceRedisLostTheRecord deletes the key's record and checks that a retry
// of the key, whose attempt 1 answered, is 409 idempotent_response_lost naming attempt 1, with
// no upstream call: the key is not run again.
func retryIsResponseLostOnceRedisLostTheRecord(t *testing.T, h *harness, key string, idem map[string]string) {
	t.Helper()
	attempt1 := h.idemRun(key, idem, 1)
	loseRecord(t, h, key, idem)
	calls := h.fake.Calls()
	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "idempotent_response_lost" || errorRunID(t, retry.body) != attempt1 {
		t.Errorf("retry once Redis lost the record: %d %s (run %q); want 409 idempotent_response_lost naming %s", retry.status, retry.body,
			retry.header.Get(proxy.RunIDHeader), attempt1)
	}
	if n := h.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls for the retry, want 0: the key ran again", n)
	}
}

// retryRunsTheKeyOnceRedisLostTheRecord deletes the key's record and checks that a retry of
// the key runs its next attempt, the attempt numbered attempt, with one upstream call: the
// attempt before it answered nothing (why says how it did not), and is passed.
func retryRunsTheKeyOnceRedisLostTheRecord(t *testing.T, h *harness, key string, idem map[string]string, attempt int, why string) {
	t.Helper()
	loseRecord(t, h, key, idem)
	calls := h.fake.Calls()
	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusOK || retry.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, attempt) {
		t.Errorf("retry once Redis lost the record: %d %s (run %q); want the key's next attempt (%d) run: %s",
			retry.status, retry.body, retry.header.Get(proxy.RunIDHeader), attempt, why)
	}
	if n := h.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls for the retry, want 1", n)
	}
}

// replayedOnce checks that the key's retry is answered's answer replayed, and that the key's
// upstream calls since calls were answered's alone.
func replayedOnce(t *testing.T, h *harness, gate *gateUpstream, key string, idem map[string]string, answered answer, calls int64) {
	t.Helper()
	replay := send(h.gw.URL, key, chatBody, idem)
	if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, answered.body) {
		t.Errorf("retry once the forwarded attempt answered: %d %s replayed %q; want its answer replayed",
			replay.status, replay.body, replay.header.Get(proxy.ReplayedHeader))
	}
	if n := gate.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls for the key past attempt 0, want the forwarded attempt's alone", n)
	}
}

// TestIdemEarlierAttemptResumedUnderALaterAttemptsMarkIsNotForwarded: attempt 2 resumes first
// and is forwarded under its mark; attempt 1's caller still waits, and attempt 1, resumed,
// marked the key as its own over attempt 2's mark (the counter that said the key had moved
// past it, lost) and was forwarded beside attempt 2: two upstream calls, two charges for one
// key. Another attempt's mark that holds answers it as a key run since: 409
// request_in_progress naming attempt 2, its charge given back whole.
func TestIdemEarlierAttemptResumedUnderALaterAttemptsMarkIsNotForwarded(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "lost-record-earlier-resumed"}
	attempt2 := h.idemRun(key, idem, 2)
	t.Cleanup(func() { gate.open("second") })
	first, second, calls := lostUnderTwoPausedAttempts(t, h, gate, context.Background(), key, idem, idem, with(idem, "X-Test-Gate", "second"))
	second.resumeAfter(h)
	gate.await(t, "second", 1)
	first.resume()
	overtaken := first.answerOf(t)
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("attempt 1 was forwarded beside attempt 2 (%d upstream calls answered while attempt 2's is held open, want 0)", n)
	}
	if overtaken.status != http.StatusConflict || errorCode(t, overtaken.body) != "request_in_progress" || errorRunID(t, overtaken.body) != attempt2 {
		t.Errorf("attempt 1's caller, resumed: %d %s; want 409 request_in_progress naming %s", overtaken.status, overtaken.body, attempt2)
	}
	secondAnswersOnceTheFirstGivenBack(t, h, gate, u.ID, key, idem, second, calls)
}

// TestIdemEarlierAttemptResumedFirstIsOvertakenByTheLaterAttempt: the other order. Attempt 1
// resumes first, its caller waiting: the key still its own by the record (lost), it marked the
// key and was forwarded; attempt 2, resumed after, was refused by that mark, its caller told 409
// naming attempt 1, a retry had taken the key over from it. The row of attempt 2, which the
// retry admitted once it had passed attempt 1, says the key moved on past attempt 1, as the
// lost counter did: attempt 1 is answered 409 request_in_progress naming attempt 2, its charge
// given back whole, and attempt 2, resumed, runs the key, as had Redis kept the record.
func TestIdemEarlierAttemptResumedFirstIsOvertakenByTheLaterAttempt(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "lost-record-earlier-first"}
	attempt2 := h.idemRun(key, idem, 2)
	t.Cleanup(func() { gate.open("second") })
	first, second, calls := lostUnderTwoPausedAttempts(t, h, gate, context.Background(), key, idem, idem, with(idem, "X-Test-Gate", "second"))
	first.resumeAfter(h)
	overtaken := first.answerOf(t)
	if overtaken.status != http.StatusConflict || errorCode(t, overtaken.body) != "request_in_progress" || errorRunID(t, overtaken.body) != attempt2 {
		t.Errorf("attempt 1's caller, resumed: %d %s; want 409 request_in_progress naming %s", overtaken.status, overtaken.body, attempt2)
	}
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("attempt 1 was forwarded though a retry had passed it (%d upstream calls, want 0)", n)
	}
	second.resumeAfter(h)
	gate.await(t, "second", 1) // attempt 2 forwarded: its answer held open at the upstream

	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "request_in_progress" {
		t.Errorf("retry while attempt 2 is forwarded: %d %s (run %q); want 409 request_in_progress",
			retry.status, retry.body, retry.header.Get(proxy.RunIDHeader))
	}
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls answered while attempt 2's is held open, want 0: the key ran again beside it", n)
	}
	secondAnswersOnceTheFirstGivenBack(t, h, gate, u.ID, key, idem, second, calls)
}

// TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwardedOnceRedisLostTheRecord: as
// TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded, attempt 1 stopped at its admission
// and charged by the peer's reconciler, the retry running attempt 2 to its answer, but Redis
// loses the key's record before attempt 1 resumes. The counter that said the key had moved past
// attempt 1 is gone and attempt 2 left no mark (it was never paused): attempt 1, resumed, found
// the key its own, was forwarded and charged beside attempt 2's answer, two upstream calls for
// one key. The row of attempt 2, which a retry admits only once it has passed attempt 1, still
// says so.
func TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwardedOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-after-record-lost"}
	attempt1, attempt2 := h.idemRun(key, idem, 1), h.idemRun(key, idem, 2)
	p := pausedAttemptCharged(t, h, key, idem)
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != attempt2 {
		t.Fatalf("retry once the paused attempt was charged: %d %s (run %q); want the key's next attempt run",
			ran.status, ran.body, ran.header.Get(proxy.RunIDHeader))
	}
	calls := h.fake.Calls()
	loseRecord(t, h, key, idem)

	first := p.answerAfter(t, holdTTL)
	h.settled()
	checkResumedAttemptGaveWay(t, h, first, calls, attempt2)
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); refunded != paused.ChargedMicro {
		t.Errorf("paused attempt charged %d, %d given back; want all of its charge given back: it was never forwarded",
			paused.ChargedMicro, refunded)
	}
}

// TestIdemOvertakenAttemptRefundedWholeIsPassedOnceRedisLostTheRecord: attempt 1 stopped at
// its admission and charged by the peer's reconciler, the retry passed it and ran attempt 2,
// which its upstream refused; attempt 1, resumed, was overtaken, not forwarded, its charge given
// back whole. Then Redis lost the key's record. A retry, its row saying reconcile_hold and no
// record left, took attempt 1 for one that may have answered and was answered 409
// idempotent_response_lost, "admitted and charged ... not run again": charged nothing, and the
// key, which no attempt ever answered, refused for replay_ttl. Its charge given back whole, it
// used nothing and cannot have answered: it is passed, and the retry runs the key.
func TestIdemOvertakenAttemptRefundedWholeIsPassedOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "overtaken-refunded-lost"}
	attempt1 := h.idemRun(key, idem, 1)
	p := pausedAttemptCharged(t, h, key, idem)
	if failed := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503")); failed.status < 500 {
		t.Fatalf("retry once the paused attempt was charged, refused by its upstream: %d %s", failed.status, failed.body)
	}
	first := p.answerAfter(t, holdTTL)
	if first.status != http.StatusConflict || errorCode(t, first.body) != "request_in_progress" {
		t.Fatalf("the paused attempt's caller, resumed: %d %s; want 409 request_in_progress (overtaken)", first.status, first.body)
	}
	h.settled()
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded != paused.ChargedMicro {
		t.Fatalf("paused attempt settled %s charged %d, %d given back; want all of its charge given back",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	retryRunsTheKeyOnceRedisLostTheRecord(t, h, key, idem, 3, "attempt 1 cost nothing")
}

// TestIdemResumedAttemptThatAnsweredIsNotRunAgainOnceRedisLostTheRecord: the counterpart of
// TestIdemOvertakenAttemptRefundedWholeIsPassedOnceRedisLostTheRecord. Attempt 1, stopped at
// its admission and charged by the peer's reconciler, is forwarded once resumed and answers;
// its pause refund gives back only what it did not use, and its row says reconcile_hold, not
// complete. Once Redis lost the key's record, its retry is 409 idempotent_response_lost, not
// run again: a refund in part is no sign that the attempt answered nothing.
func TestIdemResumedAttemptThatAnsweredIsNotRunAgainOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-answered-lost"}
	paused := answeredAfterItsPause(t, h, holdTTL, u.ID, key, idem)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded <= 0 || refunded >= paused.ChargedMicro {
		t.Fatalf("resumed attempt settled %s charged %d, %d given back; want what it did not use given back",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	retryIsResponseLostOnceRedisLostTheRecord(t, h, key, idem)
}

// TestIdemResumedAttemptThatAnsweredFreeIsNotRunAgainOnceRedisLostTheRecord: as
// TestIdemResumedAttemptThatAnsweredIsNotRunAgainOnceRedisLostTheRecord, for a caller whose
// plan gives its calls free (discount_bp 10000). The answered attempt's own settlement would
// have charged 0, so its pause refund gives back the whole of its hold's charge, as an
// overtaken attempt's does: a whole refund says the attempt cost nothing, not that it
// answered nothing. Taken for one that answered nothing, it was passed once Redis lost the
// key's record, and the retry ran the key a second time.
func TestIdemResumedAttemptThatAnsweredFreeIsNotRunAgainOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	free := 10_000
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, nil, &free); err != nil {
		t.Fatal(err)
	}
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-answered-free-lost"}
	paused := answeredAfterItsPause(t, h, holdTTL, u.ID, key, idem)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || paused.ChargedMicro <= 0 || refunded != paused.ChargedMicro {
		t.Fatalf("resumed attempt settled %s charged %d, %d given back; want all of it given back (its call was free)",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	retryIsResponseLostOnceRedisLostTheRecord(t, h, key, idem)
}

// TestIdemResumedAttemptRefusedByItsUpstreamIsPassedOnceRedisLostTheRecord: attempt 1, stopped
// at its admission and charged by the peer's reconciler, is forwarded once resumed and refused
// by its upstream: its caller is answered the error, its settlement (upstream_error) would have
// charged nothing, and its pause refund gives back the whole charge. Then Redis lost the key's
// record. The refund's reason said only that the call used less (or nothing), as a free call's
// that answered does, and the attempt was taken as pinned: the retry was told 409
// idempotent_response_lost, "admitted and charged ... not run again", of an attempt that
// answered nothing and cost nothing, and the key refused for replay_ttl. Its refund says its
// upstream refused it: it is passed, and the retry runs the key.
func TestIdemResumedAttemptRefusedByItsUpstreamIsPassedOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-refused-lost"}
	attempt1 := h.idemRun(key, idem, 1)
	// Attempt 0 and the paused attempt 1 are refused by their upstream; the retry is not.
	first := pausedAttemptCharged(t, h, key, with(idem, fakellm.HeaderStatus, "503")).answerAfter(t, holdTTL)
	if first.status < 500 || first.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Fatalf("the paused attempt's caller, resumed and refused by its upstream: %d %s (run %q); want its upstream's error",
			first.status, first.body, first.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || paused.ChargedMicro <= 0 || refunded != paused.ChargedMicro {
		t.Fatalf("paused attempt settled %s charged %d, %d given back; want all of its charge given back (its upstream refused it)",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	retryRunsTheKeyOnceRedisLostTheRecord(t, h, key, idem, 2, "attempt 1 answered nothing")
}

// TestIdemResumedAttemptRefusedByItsUpstreamKilledBeforeItsRefundIsPassedOnceRedisLostTheRecord:
// as TestIdemResumedAttemptRefusedByItsUpstreamIsPassedOnceRedisLostTheRecord, but attempt 1's
// process is killed after its upstream_error settlement found the hold charged and before its
// own refund: a reconciler's pass refunds the charge from the call's zero tally. The pass's
// reason said only that the tally said the call used less (or nothing), so the retry, once
// Redis lost the key's record, took attempt 1 as pinned and was told 409
// idempotent_response_lost of an attempt that answered nothing. The tally carries its
// settlement's source, and the pass's refund says the upstream refused the call: the retry
// runs the key. The process, let go after all, finds the pass's grant and pays nothing more.
func TestIdemResumedAttemptRefusedByItsUpstreamKilledBeforeItsRefundIsPassedOnceRedisLostTheRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	ctx := context.Background()
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-refused-killed-lost"}
	attempt1 := h.idemRun(key, idem, 1)
	p := pausedAttemptCharged(t, h, key, with(idem, fakellm.HeaderStatus, "503"))
	killed, revive := h.holdAtFirst("refund")
	first := p.answerAfter(t, holdTTL)
	if first.status < 500 || first.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Fatalf("the paused attempt's caller, resumed and refused by its upstream: %d %s (run %q); want its upstream's error",
			first.status, first.body, first.header.Get(proxy.RunIDHeader))
	}
	select {
	case <-killed:
	case <-time.After(20 * time.Second):
		t.Fatal("attempt 1's process never reached its refund")
	}
	waitFor(t, "attempt 1's tally", func() bool {
		_, found, err := h.tally.Get(ctx, attempt1)
		return err == nil && found
	})
	paused, err := h.store.Run(ctx, u.ID, attempt1) // not h.run: it waits for the settlement held at its refund
	if err != nil {
		t.Fatal(err)
	}
	if paused.SettleSource.String != holds.SourceReconcileHold || paused.ChargedMicro <= 0 || grantedTo(t, h, u.ID) != 0 {
		t.Fatalf("attempt 1 settled %s charged %d, %d given back; want its hold charged and nothing given back yet",
			paused.SettleSource.String, paused.ChargedMicro, grantedTo(t, h, u.ID))
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally}, Leases: noLeases{},
		Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute, RefundWindow: time.Hour})
	if st, err := rec.RunOnce(ctx); err != nil || st.PauseRefunds != 1 || grantedTo(t, h, u.ID) != paused.ChargedMicro {
		t.Fatalf("the pass: %+v, %v, %d given back; want all of attempt 1's %d", st, err, grantedTo(t, h, u.ID), paused.ChargedMicro)
	}
	retryRunsTheKeyOnceRedisLostTheRecord(t, h, key, idem, 2, "attempt 1 answered nothing, its refund the reconciler's")

	revive()
	h.settled()
	if refunded := grantedTo(t, h, u.ID); refunded != paused.ChargedMicro {
		t.Errorf("after attempt 1's own refund, %d given back; want the pass's %d alone", refunded, paused.ChargedMicro)
	}
}
