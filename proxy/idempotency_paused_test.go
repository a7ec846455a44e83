package proxy_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// The pause (SIGSTOP, a VM's live migration) of an Idempotency-Key attempt's process between
// its hold's COMMIT and its forward is stood in for by holding the attempt at its admission
// ("attempt admitted") past hold_ttl and admit_timeout, its hold settled under it as a peer's
// reconciler settles an unleased, untallied hold (reconcile_hold), while the caller's retries
// under the key reach the gateway. The caller of the paused attempt waits: resumed, the attempt
// is forwarded as the call it has paid for (paidUnderAPause) unless the key has moved on.

// pausedAttempt is one paused attempt: its caller's answer once resumed, and resume.
type pausedAttempt struct {
	done   chan answer
	resume func()
	sent   time.Time
}

// pauseAttempt sends chatBody under hdr and holds the request at the first "attempt admitted"
// the gateway reaches from now on, until resume.
func pauseAttempt(t *testing.T, h *harness, key string, hdr map[string]string) *pausedAttempt {
	t.Helper()
	reached, let := make(chan struct{}), make(chan struct{})
	var seen atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "attempt admitted" && seen.Add(1) == 1 {
			close(reached)
			<-let
		}
	})
	var once sync.Once
	p := &pausedAttempt{done: make(chan answer, 1), resume: func() { once.Do(func() { close(let) }) }, sent: time.Now()}
	t.Cleanup(p.resume)
	go func() { p.done <- send(h.gw.URL, key, chatBody, hdr) }()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt never reached its admission")
	}
	return p
}

// answerAfter resumes the paused attempt once it has been stopped longer than its hold lives
// (as it must have been for a reconciler to charge it) and returns what its caller got.
func (p *pausedAttempt) answerAfter(t *testing.T, holdTTL time.Duration) answer {
	t.Helper()
	time.Sleep(time.Until(p.sent.Add(holdTTL + 100*time.Millisecond)))
	p.resume()
	select {
	case a := <-p.done:
		if a.err != nil {
			t.Fatalf("the paused attempt's caller: %v", a.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after the resume")
	}
	return answer{}
}

func pausedIdemHarness(t *testing.T) (*harness, time.Duration) {
	const holdTTL = 2 * time.Second
	return newHarness(t, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = holdTTL, time.Second, time.Second
		c.Limits.SettleTimeout = 2 * time.Second
	}), holdTTL
}

// TestIdemRetryWhileTheFirstAttemptIsPausedBeforeItsRecord: the first attempt's process is
// stopped before it wrote the key's record. Each moment of the pause answers the retry:
// before the peer's reconciler charged the hold, 409 request_in_progress (retry); after it,
// 409 idempotent_response_lost — the record is gone, and the gateway cannot tell the attempt
// from one that pinned the key before Redis lost its record (README Known limits), nor a
// stopped process from a killed one. Resumed, the attempt is forwarded as the call it paid
// for, its answer pins the key, and the retries from then on are that answer replayed: one
// upstream call, charged what it used (the hold's charge less the pause's refund).
func TestIdemRetryWhileTheFirstAttemptIsPausedBeforeItsRecord(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-before-record"}
	attempt0 := proxy.IdempotentRunID(u.ID, "paused-before-record", 0)
	p := pauseAttempt(t, h, key, idem)

	running := send(h.gw.URL, key, chatBody, idem)
	if running.status != http.StatusConflict || errorCode(t, running.body) != "request_in_progress" ||
		running.header.Get("Retry-After") != "1" || running.header.Get("X-Should-Retry") != "true" {
		t.Fatalf("retry while the paused attempt's hold lives: %d %s %v; want 409 request_in_progress, Retry-After: 1",
			running.status, running.body, running.header)
	}
	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	lost := send(h.gw.URL, key, chatBody, idem)
	if lost.status != http.StatusConflict || errorCode(t, lost.body) != "idempotent_response_lost" || errorRunID(t, lost.body) != attempt0 {
		t.Fatalf("retry once the paused attempt was charged: %d %s; want 409 idempotent_response_lost naming %s", lost.status, lost.body, attempt0)
	}
	if n := h.fake.Calls(); n != 0 {
		t.Fatalf("%d upstream calls during the pause, want 0", n)
	}

	first := p.answerAfter(t, holdTTL)
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt0 {
		t.Fatalf("the paused attempt's caller, resumed: %d %s (run %q); want the answer it paid for", first.status, first.body,
			first.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	replay := send(h.gw.URL, key, chatBody, idem)
	if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, first.body) {
		t.Errorf("retry once the resumed attempt answered: %d %s replayed %q; want its answer replayed",
			replay.status, replay.body, replay.header.Get(proxy.ReplayedHeader))
	}
	if n := h.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
	r := h.run(u.ID, attempt0)
	if refunded := grantedTo(t, h, u.ID); r.SettleSource.String != holds.SourceReconcileHold || refunded <= 0 || refunded >= r.ChargedMicro {
		t.Errorf("attempt settled %s charged %d, %d given back; want its hold charged and given back all but what the call used",
			r.SettleSource.String, r.ChargedMicro, refunded)
	}
}

// TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded: an attempt whose process is stopped
// after the key's record exists (here, a second attempt, the first refused by its upstream)
// is charged its hold by the peer's reconciler; the caller's retry then finds it settled,
// cannot tell it from a killed process's, and runs the key's next attempt, which pins it.
// Resumed, the stopped attempt must not be forwarded: the key has been run, and forwarded it
// was a second upstream call for the one request, charged again (what it used, beside the
// later attempt's charge), its answer stored nowhere. Its caller is told 409
// request_in_progress, whose retry is the later attempt's answer replayed, and its hold's
// charge is given back whole.
func TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-after-record"}
	attempt1 := proxy.IdempotentRunID(u.ID, "paused-after-record", 1)
	attempt2 := proxy.IdempotentRunID(u.ID, "paused-after-record", 2)
	refused := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "paused-after-record", fakellm.HeaderStatus: "503"})
	if refused.status < 500 {
		t.Fatalf("the first attempt, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	p := pauseAttempt(t, h, key, idem)
	if st := h.reconcileExpired(t, "run_id = ?", attempt1); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != attempt2 {
		t.Fatalf("retry once the paused attempt was charged: %d %s (run %q); want the key's next attempt run",
			ran.status, ran.body, ran.header.Get(proxy.RunIDHeader))
	}
	calls := h.fake.Calls()

	first := p.answerAfter(t, holdTTL)
	h.settled()
	if n := h.fake.Calls(); n != calls {
		t.Errorf("the paused attempt was forwarded once resumed (%d upstream calls after it, want 0): the key ran twice", n-calls)
	}
	if first.status != http.StatusConflict || errorCode(t, first.body) != "request_in_progress" || errorRunID(t, first.body) != attempt2 ||
		first.header.Get("X-Should-Retry") != "true" {
		t.Errorf("the paused attempt's caller, resumed: %d %s; want 409 request_in_progress naming %s, to be retried", first.status, first.body, attempt2)
	}
	replay := send(h.gw.URL, key, chatBody, idem)
	if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, ran.body) {
		t.Errorf("its retry: %d %s replayed %q; want the key's answer (%s) replayed", replay.status, replay.body,
			replay.header.Get(proxy.ReplayedHeader), attempt2)
	}
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded != paused.ChargedMicro {
		t.Errorf("paused attempt settled %s charged %d, %d given back; want all of its charge given back: it was never forwarded",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	if r := h.run(u.ID, attempt2); r.SettleSource.String != holds.SourceComplete || r.ChargedMicro <= 0 {
		t.Errorf("the key's answered attempt settled %s charged %d", r.SettleSource.String, r.ChargedMicro)
	}
}

// grantedTo is what was granted to the user: the pause's refunds, in these tests.
func grantedTo(t *testing.T, h *harness, userID uint64) int64 {
	t.Helper()
	var granted int64
	if err := h.db.Get(&granted, "SELECT COALESCE(SUM(amount_micro), 0) FROM grants WHERE user_id = ?", userID); err != nil {
		t.Fatal(err)
	}
	return granted
}

// TestIdemAttemptPausedBeforeItsRecordWhoseCallerLeftRunsWhenRetried: as
// TestIdemRetryWhileTheFirstAttemptIsPausedBeforeItsRecord, but the paused attempt's caller
// leaves during the pause (a client's timeout): its retry once the hold was charged is 409
// idempotent_response_lost, as there; resumed, the attempt is not forwarded, its charge is given
// back whole, and it leaves the key free: the next retry runs, charged once.
func TestIdemAttemptPausedBeforeItsRecordWhoseCallerLeftRunsWhenRetried(t *testing.T) {
	h, _ := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-caller-left"}
	attempt0 := proxy.IdempotentRunID(u.ID, "paused-caller-left", 0)
	attempt1 := proxy.IdempotentRunID(u.ID, "paused-caller-left", 1)
	reached, resume := h.holdAtFirst("attempt admitted")
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	left := make(chan answer, 1)
	go func() { left <- sendToCtx(ctx, h.gw.URL, "/v1/chat/completions", key, chatBody, idem) }()
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt never reached its admission")
	}
	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	if lost := send(h.gw.URL, key, chatBody, idem); lost.status != http.StatusConflict || errorCode(t, lost.body) != "idempotent_response_lost" {
		t.Fatalf("retry once the paused attempt was charged: %d %s; want 409 idempotent_response_lost", lost.status, lost.body)
	}
	leave()
	<-left
	resume()
	h.settled()
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Fatalf("retry once the resumed attempt, its caller gone, ended: %d %s (run %q); want the key's next attempt run",
			ran.status, ran.body, ran.header.Get(proxy.RunIDHeader))
	}
	if n := h.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
	paused := h.run(u.ID, attempt0)
	if refunded := grantedTo(t, h, u.ID); refunded != paused.ChargedMicro {
		t.Errorf("paused attempt charged %d (%s), %d given back; want all of it: it was never forwarded",
			paused.ChargedMicro, paused.SettleSource.String, refunded)
	}
}
