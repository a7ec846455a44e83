package proxy_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
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
	return newHarness(t, pausedIdemSettings), pausedIdemHoldTTL
}

// pausedIdemHoldTTL is the hold's life under pausedIdemSettings: an attempt paused past it is
// charged its hold by the peer's reconciler.
const pausedIdemHoldTTL = 2 * time.Second

// pausedIdemSettings is pausedIdemHarness's configuration.
func pausedIdemSettings(c *config.Config) {
	c.Holds.HoldTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = pausedIdemHoldTTL, time.Second, time.Second
	c.Limits.SettleTimeout = 2 * time.Second
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
	checkResumedAttemptGaveWay(t, h, first, calls, attempt2)
	checkKeyAnsweredOnceAfterItsPause(t, h, u.ID, key, idem, ran, attempt1, attempt2)
}

// checkResumedAttemptGaveWay checks the answer first of a key's paused attempt, resumed once the
// key's attempt2 had passed it, calls being the upstream's count before it resumed: it was not
// forwarded, and its caller was told 409 request_in_progress naming attempt2, to be retried.
func checkResumedAttemptGaveWay(t *testing.T, h *harness, first answer, calls int64, attempt2 string) {
	t.Helper()
	if n := h.fake.Calls(); n != calls {
		t.Errorf("the paused attempt was forwarded once resumed (%d upstream calls after it, want 0): the key had moved past it", n-calls)
	}
	if first.status != http.StatusConflict || errorCode(t, first.body) != "request_in_progress" || errorRunID(t, first.body) != attempt2 ||
		first.header.Get("X-Should-Retry") != "true" {
		t.Errorf("the paused attempt's caller, resumed: %d %s; want 409 request_in_progress naming %s, to be retried", first.status, first.body, attempt2)
	}
}

// checkKeyAnsweredOnceAfterItsPause checks the end of a key whose attempt1 was paused past its
// hold, charged whole by a peer (reconcile_hold) and never forwarded, and whose attempt2 answered
// ran: a retry is answered ran replayed, attempt1's charge was given back whole, and attempt2
// was charged what it used.
func checkKeyAnsweredOnceAfterItsPause(t *testing.T, h *harness, userID uint64, key string, idem map[string]string, ran answer, attempt1, attempt2 string) {
	t.Helper()
	replay := send(h.gw.URL, key, chatBody, idem)
	if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, ran.body) {
		t.Errorf("a retry once the key answered: %d %s replayed %q; want %s's answer replayed", replay.status, replay.body,
			replay.header.Get(proxy.ReplayedHeader), attempt2)
	}
	paused := h.run(userID, attempt1)
	if refunded := grantedTo(t, h, userID); paused.SettleSource.String != holds.SourceReconcileHold || refunded != paused.ChargedMicro {
		t.Errorf("paused attempt settled %s charged %d, %d given back; want all of its charge given back: it was never forwarded",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
	if r := h.run(userID, attempt2); r.SettleSource.String != holds.SourceComplete || r.ChargedMicro <= 0 {
		t.Errorf("the key's answered attempt settled %s charged %d; want it charged what it used", r.SettleSource.String, r.ChargedMicro)
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
	go func() {
		left <- sendToCtx(ctx, h.gw.URL, "/v1/chat/completions", key, chatBody, with(idem, watchHeader, "paused"))
	}()
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
	h.callerGone("paused") // resumed before the gateway saw it leave, it is forwarded and charged its prompt
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

// resumedAttempt plays TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded's scene up to
// the resume, with no retry during the pause: the key's attempt 0 refused by its upstream (the
// key's record written), attempt 1 stopped at its admission, its hold charged by the peer's
// reconciler, then resumed past its hold's life. Its upstream call, if it is forwarded, waits
// at gate "resumed" until the test opens it; hdr, if set, is sent with it alone. It returns the
// attempt and the upstream's calls so far.
func resumedAttempt(t *testing.T, h *harness, gate *gateUpstream, key string, idem map[string]string, hdr ...string) (*pausedAttempt, int64) {
	t.Helper()
	refused := send(h.gw.URL, key, chatBody, with(idem, fakellm.HeaderStatus, "503"))
	if refused.status < 500 {
		t.Fatalf("the first attempt, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	calls := gate.fake.Calls()
	t.Cleanup(func() { gate.open("resumed") })
	paused := with(idem, "X-Test-Gate", "resumed")
	for i := 0; i+1 < len(hdr); i += 2 {
		paused = with(paused, hdr[i], hdr[i+1])
	}
	p := pauseAttempt(t, h, key, paused)
	if st := h.reconcileExpired(t, "run_id = ?", h.idemRun(key, idem, 1)); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	time.Sleep(time.Until(p.sent.Add(h.cfg.Holds.HoldTTL + 100*time.Millisecond))) // stopped past its hold's life
	p.resume()
	return p, calls
}

// idemRun is the run id of attempt n of idem's key for the user of API key key.
func (h *harness) idemRun(key string, idem map[string]string, n int) string {
	h.t.Helper()
	u, err := h.store.UserByKey(context.Background(), key)
	if err != nil {
		h.t.Fatal(err)
	}
	return proxy.IdempotentRunID(u.ID, idem[proxy.IdempotencyKeyHeader], n)
}

// pausedGateHarness is pausedIdemHarness's gateway with its upstream behind a gateUpstream;
// setup as newHarnessOn's, tweaks applied to its configuration after its own.
func pausedGateHarness(t *testing.T, setup harnessSetup, tweaks ...func(*config.Config)) (*harness, *gateUpstream) {
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	return newHarnessOn(t, setup, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = 2*time.Second, time.Second, time.Second
		c.Limits.SettleTimeout = 2 * time.Second
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL = gateSrv.URL
		}
		for _, tweak := range tweaks {
			tweak(c)
		}
	}), gate
}

// answerOf is what the resumed attempt's caller got.
func (p *pausedAttempt) answerOf(t *testing.T) answer {
	t.Helper()
	select {
	case a := <-p.done:
		if a.err != nil {
			t.Fatalf("the resumed attempt's caller: %v", a.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer for the resumed attempt")
	}
	return answer{}
}

// chargedRuns is how many of the user's runs were charged anything.
func chargedRuns(t *testing.T, h *harness, userID uint64) int {
	t.Helper()
	var n int
	if err := h.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND charged_micro > 0", userID); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestIdemRetryWhileTheResumedAttemptIsForwardedIsNotRun: as
// TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded, but the caller's retry comes only
// once the stopped attempt, resumed, has found its key still its own and been forwarded (its
// answer held open at the upstream). The retry finds the attempt's hold settled (the peer's
// reconciler charged it) and cannot tell a resumed process from a killed one by the hold; run
// as the key's next attempt, it was a second upstream call for the one request, charged again
// beside the resumed attempt's. The resumed attempt marks the key's record before its forward
// (claimForward), so the retry is answered 409 request_in_progress (retry) as for any running
// attempt, and its retry after the answer is that answer replayed: one upstream call, charged
// once, what it used.
func TestIdemRetryWhileTheResumedAttemptIsForwardedIsNotRun(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-being-forwarded"}
	attempt1 := h.idemRun(key, idem, 1)
	p, calls := resumedAttempt(t, h, gate, key, idem)
	gate.await(t, "resumed", 1) // forwarded: its answer held open at the upstream

	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "request_in_progress" || errorRunID(t, retry.body) != attempt1 ||
		retry.header.Get("Retry-After") != "1" || retry.header.Get("X-Should-Retry") != "true" {
		t.Errorf("retry while the resumed attempt is forwarded: %d %s (run %q); want 409 request_in_progress naming %s, Retry-After: 1",
			retry.status, retry.body, retry.header.Get(proxy.RunIDHeader), attempt1)
	}
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls answered while the resumed attempt's is held open, want 0: the retry ran the key again", n)
	}

	gate.open("resumed")
	first := p.answerOf(t)
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Fatalf("the resumed attempt's caller: %d %s (run %q); want the answer it paid for", first.status, first.body,
			first.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	replay := send(h.gw.URL, key, chatBody, idem)
	if replay.status != http.StatusOK || replay.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(replay.body, first.body) {
		t.Errorf("retry once the resumed attempt answered: %d %s replayed %q; want its answer replayed",
			replay.status, replay.body, replay.header.Get(proxy.ReplayedHeader))
	}
	if n := gate.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls for the key's attempts past the first, want 1", n)
	}
	r := h.run(u.ID, attempt1)
	if charged, refunded := chargedRuns(t, h, u.ID), grantedTo(t, h, u.ID); charged != 1 ||
		r.SettleSource.String != holds.SourceReconcileHold || refunded <= 0 || refunded >= r.ChargedMicro {
		t.Errorf("%d runs charged; the resumed attempt settled %s charged %d, %d given back; want it alone charged, what its call used",
			charged, r.SettleSource.String, r.ChargedMicro, refunded)
	}
}

// TestIdemForwardMarkOfAResumedAttemptLapses: the mark a resumed attempt leaves on its key's
// record holds for the longest a call lives (maxCall), so that a process killed mid-forward
// does not keep its key's retries at 409 for good. Lapsed (its time set in the past, as the
// Redis clock would have passed it), a retry runs the key's next attempt, as for any attempt
// whose hold was settled under its killed process.
func TestIdemForwardMarkOfAResumedAttemptLapses(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-mark-lapses"}
	_, calls := resumedAttempt(t, h, gate, key, idem)
	gate.await(t, "resumed", 1)
	record := h.keys.Replay(h.idemRun(key, idem, 0))
	if until, err := h.rdb.HGet(context.Background(), record, "fwd_until").Int64(); err != nil || until <= time.Now().UnixMilli() {
		t.Fatalf("the resumed attempt's mark: %d %v; want it to hold for now", until, err)
	}
	if err := h.rdb.HSet(context.Background(), record, "fwd_until", time.Now().Add(-time.Second).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, 2) {
		t.Errorf("retry once the mark lapsed: %d %s (run %q); want the key's next attempt run", ran.status, ran.body,
			ran.header.Get(proxy.RunIDHeader))
	}
	if n := gate.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls, want the retry's", n)
	}
	gate.open("resumed")
}

// TestIdemResumedAttemptWhoseMarkFailedIsNotForwarded: a resumed attempt that cannot mark its
// key's record (Redis refuses that write) is not forwarded, as a retry could then run the key
// beside it unseen: its caller is told 503 dedup_unavailable (retry), its hold's charge is
// given back whole, and its retry runs the key's next attempt, charged once.
func TestIdemResumedAttemptWhoseMarkFailedIsNotForwarded(t *testing.T) {
	blip := &failingWrites{marker: []byte(proxy.ClaimForwardScriptSHA)}
	h, gate := pausedGateHarness(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: blip} }),
		contextTimeouts: true,
	})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-mark-failed"}
	attempt1 := h.idemRun(key, idem, 1)
	blip.on.Store(true)
	p, calls := resumedAttempt(t, h, gate, key, idem)
	first := p.answerOf(t)
	blip.on.Store(false)
	if first.status != http.StatusServiceUnavailable || errorCode(t, first.body) != "dedup_unavailable" || first.header.Get("Retry-After") != "1" {
		t.Errorf("the resumed attempt's caller, its mark refused: %d %s; want 503 dedup_unavailable, Retry-After: 1", first.status, first.body)
	}
	h.settled()
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, 2) {
		t.Errorf("its retry: %d %s (run %q); want the key's next attempt run", ran.status, ran.body, ran.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	if n := gate.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls, want the retry's alone", n)
	}
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded != paused.ChargedMicro {
		t.Errorf("paused attempt settled %s charged %d, %d given back; want all of its charge given back: it was never forwarded",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
}

// TestIdemResumedAttemptWhoseMarkFailedIsForwardedUnderFailOpen: as
// TestIdemResumedAttemptWhoseMarkFailedIsNotForwarded, on a gateway that goes on when a
// duplicate check cannot be made (dedup.fail_open): the resumed attempt whose mark Redis
// refused is forwarded, the call its caller paid for, as fail_open forwards any call whose
// check failed, and charged what it used; not answered 503 dedup_unavailable, as a gateway
// that fails closed answers it.
func TestIdemResumedAttemptWhoseMarkFailedIsForwardedUnderFailOpen(t *testing.T) {
	blip := &failingWrites{marker: []byte(proxy.ClaimForwardScriptSHA)}
	h, gate := pausedGateHarness(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: blip} }),
		contextTimeouts: true,
	}, func(c *config.Config) { c.Dedup.FailOpen = true })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-mark-failed-open"}
	attempt1 := h.idemRun(key, idem, 1)
	blip.on.Store(true)
	p, calls := resumedAttempt(t, h, gate, key, idem)
	gate.open("resumed")
	first := p.answerOf(t)
	blip.on.Store(false)
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt1 {
		t.Errorf("the resumed attempt's caller, its mark refused under fail_open: %d %s (run %q); want the answer it paid for",
			first.status, first.body, first.header.Get(proxy.RunIDHeader))
	}
	h.settled()
	if n := gate.fake.Calls() - calls; n != 1 {
		t.Errorf("%d upstream calls after the resume, want the resumed attempt's", n)
	}
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded <= 0 || refunded >= paused.ChargedMicro {
		t.Errorf("paused attempt settled %s charged %d, %d given back; want what its call did not use of its charge given back",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
}

// TestIdemResumedAttemptThatFailedLeavesItsKeyFree: the resumed attempt's own end drops its
// mark as it moves the key on: one its upstream refused (unpinned) leaves the key to its
// retry at once, not at 409 request_in_progress until the mark would have lapsed.
func TestIdemResumedAttemptThatFailedLeavesItsKeyFree(t *testing.T) {
	h, gate := pausedGateHarness(t, harnessSetup{})
	_, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-then-refused"}
	p, _ := resumedAttempt(t, h, gate, key, idem, fakellm.HeaderStatus, "503")
	gate.await(t, "resumed", 1)
	gate.open("resumed")
	if first := p.answerOf(t); first.status < 500 {
		t.Fatalf("the resumed attempt, refused by its upstream: %d %s", first.status, first.body)
	}
	h.settled()
	ran := send(h.gw.URL, key, chatBody, idem)
	if ran.status != http.StatusOK || ran.header.Get(proxy.RunIDHeader) != h.idemRun(key, idem, 2) {
		t.Errorf("retry once the resumed attempt failed: %d %s (run %q); want the key's next attempt run", ran.status, ran.body,
			ran.header.Get(proxy.RunIDHeader))
	}
}

// TestIdemAttemptPausedWhileARetryFailedTheKeyIsNotForwarded: as
// TestIdemAttemptPausedWhileARetryRanTheKeyIsNotForwarded, but the retry's attempt, refused by
// its upstream, pins nothing: the record names no run, only a later attempt (claimForward). The
// key was still moved on past the stopped attempt, whose answer, forwarded, is stored nowhere:
// it is not forwarded, its caller told 409 request_in_progress naming the later attempt, its
// charge given back whole. Mutant: the attempt counter not read (the stopped attempt forwarded,
// a second upstream call for the one key).
func TestIdemAttemptPausedWhileARetryFailedTheKeyIsNotForwarded(t *testing.T) {
	h, holdTTL := pausedIdemHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "paused-retry-failed"}
	refusedHdr := map[string]string{proxy.IdempotencyKeyHeader: "paused-retry-failed", fakellm.HeaderStatus: "503"}
	attempt1 := proxy.IdempotentRunID(u.ID, "paused-retry-failed", 1)
	attempt2 := proxy.IdempotentRunID(u.ID, "paused-retry-failed", 2)
	if refused := send(h.gw.URL, key, chatBody, refusedHdr); refused.status < 500 {
		t.Fatalf("the first attempt, refused by its upstream: %d %s", refused.status, refused.body)
	}
	h.settled()
	p := pauseAttempt(t, h, key, idem)
	if st := h.reconcileExpired(t, "run_id = ?", attempt1); st.ChargedHeld != 1 {
		t.Fatalf("the peer's reconcile of the paused attempt: %+v; want its hold charged (no tally)", st)
	}
	failed := send(h.gw.URL, key, chatBody, refusedHdr)
	if failed.status < 500 || failed.header.Get(proxy.RunIDHeader) != attempt2 {
		t.Fatalf("retry once the paused attempt was charged: %d %s (run %q); want the key's next attempt run and refused by its upstream",
			failed.status, failed.body, failed.header.Get(proxy.RunIDHeader))
	}
	calls := h.fake.Calls()

	first := p.answerAfter(t, holdTTL)
	h.settled()
	if n := h.fake.Calls(); n != calls {
		t.Errorf("the paused attempt was forwarded once resumed (%d upstream calls after it, want 0): the key ran again past it", n-calls)
	}
	// The record's counter is past the failed attempt too: the later attempt it names is 2's or
	// the one a retry runs next (3).
	later := map[string]bool{attempt2: true, proxy.IdempotentRunID(u.ID, "paused-retry-failed", 3): true}
	if first.status != http.StatusConflict || errorCode(t, first.body) != "request_in_progress" || !later[errorRunID(t, first.body)] {
		t.Errorf("the paused attempt's caller, resumed: %d %s; want 409 request_in_progress naming a later attempt", first.status, first.body)
	}
	paused := h.run(u.ID, attempt1)
	if refunded := grantedTo(t, h, u.ID); paused.SettleSource.String != holds.SourceReconcileHold || refunded != paused.ChargedMicro {
		t.Errorf("paused attempt settled %s charged %d, %d given back; want all of its charge given back: it was never forwarded",
			paused.SettleSource.String, paused.ChargedMicro, refunded)
	}
}

// TestIdemForwardMarkOutlivesAShortReplayTTL: the mark a resumed attempt leaves on its key's
// record lives in that record, whose expiry the mark's write set to replay_ttl. With a
// replay_ttl shorter than the longest call (maxCall: a short replay window is a valid
// setting), the record, mark and all, expired while the attempt was still being forwarded; the
// retry then found no record, took the attempt (charged by the peer's reconciler, admitted
// longer than replay_ttl ago) for one that had not pinned, and ran the key's next attempt
// beside it: two upstream calls, two charges. The record is kept at least as long as its mark.
func TestIdemForwardMarkOutlivesAShortReplayTTL(t *testing.T) {
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	const replayTTL = 3 * time.Second
	h := newHarnessOn(t, harnessSetup{}, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval, c.Limits.AdmitTimeout = 2*time.Second, time.Second, time.Second
		c.Limits.SettleTimeout = 2 * time.Second
		c.Dedup.ReplayTTL = replayTTL
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL = gateSrv.URL
		}
	})
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "resumed-short-replay-ttl"}
	attempt1 := h.idemRun(key, idem, 1)
	p, calls := resumedAttempt(t, h, gate, key, idem)
	gate.await(t, "resumed", 1) // forwarded: its answer held open at the upstream
	record := h.keys.Replay(h.idemRun(key, idem, 0))
	ctx := context.Background()
	until, err := h.rdb.HGet(ctx, record, "fwd_until").Int64()
	if err != nil {
		t.Fatalf("the resumed attempt's mark: %v", err)
	}
	// Past replay_ttl since the mark (the record expired, or kept), well within the mark's own
	// time (maxCall: minutes).
	marked := time.UnixMilli(until).Add(-(h.cfg.Limits.UpstreamTimeout + h.cfg.Limits.ClientWriteTimeout + time.Minute))
	for h.rdb.Exists(ctx, record).Val() == 1 && time.Now().Before(marked.Add(replayTTL+500*time.Millisecond)) {
		time.Sleep(50 * time.Millisecond)
	}
	if time.Now().UnixMilli() >= until {
		t.Fatalf("the mark lapsed (%d) before the check", until)
	}

	retry := send(h.gw.URL, key, chatBody, idem)
	if retry.status != http.StatusConflict || errorCode(t, retry.body) != "request_in_progress" || errorRunID(t, retry.body) != attempt1 {
		t.Errorf("retry past replay_ttl while the resumed attempt is forwarded: %d %s (run %q); want 409 request_in_progress naming %s",
			retry.status, retry.body, retry.header.Get(proxy.RunIDHeader), attempt1)
	}
	if n := gate.fake.Calls() - calls; n != 0 {
		t.Errorf("%d upstream calls answered while the resumed attempt's is held open, want 0: the retry ran the key again", n)
	}
	gate.open("resumed")
	if first := p.answerOf(t); first.status != http.StatusOK {
		t.Fatalf("the resumed attempt's caller: %d %s; want the answer it paid for", first.status, first.body)
	}
	h.settled()
	if charged := chargedRuns(t, h, u.ID); charged != 1 {
		t.Errorf("%d runs charged, want the resumed attempt alone", charged)
	}
}
