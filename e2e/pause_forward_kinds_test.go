package e2e

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// pausedBeforeForward is TestGatewayPausedBetweenItsHoldAndTheForward's scene for a call sent
// with hdr: its gateway g is stopped the moment its admission's closing script goes out, for
// longer than the hold lives and than admit_timeout, while a peer serves and reconciles. It
// returns what the caller got once g was resumed, and the hold's row as the peer's reconciler
// left it before the resume. holdOf finds the paused call's hold among the user's.
func pausedBeforeForward(t *testing.T, w *pausedWorld, g *gateway, key string, hdr map[string]string, holdOf func() string) (seen, holds.Run) {
	t.Helper()
	return pausedBeforeForwardWhile(t, w, g, key, hdr, holdOf, nil)
}

// pausedBeforeForwardWhile is pausedBeforeForward with during, if set, run while g is stopped,
// once the peer's reconciler has settled the call's hold.
func pausedBeforeForwardWhile(t *testing.T, w *pausedWorld, g *gateway, key string, hdr map[string]string, holdOf func() string, during func()) (seen, holds.Run) {
	t.Helper()
	body := chatRequest(false, 40, "the call whose gateway the pause catches")
	fired := w.relay.armToStop(g.cmd.Process.Pid, admissionScript)
	first := make(chan seen, 1)
	go func() { first <- w.calls.call(g, key, body, hdr) }()
	p := pausedOn(t, g, fired, "closing script")
	var runID string
	waitFor(t, 10*time.Second, "the hold committed", func() bool { runID = holdOf(); return runID != "" })
	waitFor(t, 30*time.Second, "the peer's reconciler to settle the paused process's hold", func() bool {
		return w.hold(runID).State == holds.StateSettled
	})
	r := w.hold(runID)
	t.Logf("settled under the paused gateway: %s charged %d (held %d, calls %d)", r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.Calls)
	if during != nil {
		during()
	}
	p.resume(t)
	var s seen
	select {
	case s = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s of the resume")
	}
	t.Logf("the caller got: %d %s complete %v (run %s), the upstream got %d calls", s.status, s.code, s.complete, s.runID, w.held.calls.Load())
	if after := w.hold(runID); after.ChargedMicro != r.ChargedMicro || after.SettleSource != r.SettleSource || after.SettledAt != r.SettledAt {
		t.Errorf("the peer's settlement changed after the resume: %s charged %d, was %s charged %d", after.SettleSource.String, after.ChargedMicro, r.SettleSource.String, r.ChargedMicro)
	}
	return s, r
}

// pause is a gateway a dbRelay stopped (SIGSTOP) on the script it was armed for.
type pause struct {
	g       *gateway
	at      time.Time
	resumed bool
}

// pausedOn waits for fired, the relay's stop of g on a script of what kind, and returns the
// pause; g is resumed (SIGCONT) at the test's end unless resume did it before.
func pausedOn(t *testing.T, g *gateway, fired <-chan struct{}, what string) *pause {
	t.Helper()
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s went out to stop the gateway on", what)
	}
	p := &pause{g: g, at: time.Now()}
	t.Cleanup(func() {
		if !p.resumed {
			_ = g.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	return p
}

// resume resumes the gateway once the pause has outlasted admit_timeout (5 s), the admission
// budget of the call it caught.
func (p *pause) resume(t *testing.T) {
	t.Helper()
	waitFor(t, 20*time.Second, "the pause to outlast admit_timeout", func() bool { return time.Since(p.at) > 6*time.Second })
	if err := p.g.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.resumed = true
}

// pausedWorld is a world with a gateway whose database traffic goes through a dbRelay, a
// peer that serves and reconciles, and one user.
type pausedWorld struct {
	*world
	relay *dbRelay
	calls *allCalls
	u     holds.User
}

func newPausedWorld(t *testing.T, name string) (*pausedWorld, *gateway, *gateway, string) {
	return newPausedWorldWith(t, name, nil)
}

// newPausedWorldWith is newPausedWorld with over applied to both gateways' config.
func newPausedWorldWith(t *testing.T, name string, over map[string]string) (*pausedWorld, *gateway, *gateway, string) {
	w := newWorld(t)
	relay := newDBRelay(t, w.mysqlAddr())
	u, key := w.user(name, 10, nil)
	config := w.config
	if over != nil {
		config = w.writeConfig(over)
	}
	g := w.startGatewayWith("gw-paused", config, "MYSQL_DSN="+w.dsnViaAddr(relay.addr()))
	peer := w.startGatewayWith("gw-peer", config)
	return &pausedWorld{world: w, relay: relay, calls: &allCalls{}, u: u}, g, peer, key
}

// books checks that the user's day ledger is the sum of its holds' charges, that this is want,
// and that the ledger audits clean.
func (w *pausedWorld) books(t *testing.T, want int64) {
	t.Helper()
	waitFor(t, 20*time.Second, "every hold settled", func() bool { return w.liveHoldsOf(w.u.ID) == 0 })
	var total int64
	if err := w.db.Get(&total, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", w.u.ID); err != nil {
		t.Fatal(err)
	}
	if used := w.ledgerUsed(w.u.ID); used != total || total != want {
		t.Errorf("day ledger %d, Σ charged %d, want both %d", used, total, want)
	}
	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("ledger audit: %v %+v", err, bad)
	}
}

func (w *pausedWorld) latestHold() func() string {
	return func() string {
		var runID string
		_ = w.db.Get(&runID, "SELECT COALESCE(MAX(run_id), '') FROM run_holds WHERE user_id = ?", w.u.ID)
		return runID
	}
}

// TestSessionCallPausedBetweenItsHoldAndTheForward: a session's message caught by the pause as
// a plain call is: its hold (a run of one call, unleased, untallied) is charged what it held by
// the peer's reconciler. Refused once resumed, its caller was told 503 billing_unavailable, "not
// made", and charged; it must be answered, charged once.
func TestSessionCallPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w, g, _, key := newPausedWorld(t, "paused-session")
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Session-Id": "chat-1", "X-Fake-Chunks": "12"}, w.latestHold())
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	if !s.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its hold charged %d by %s: charged for a call it was told was not made",
			s.status, s.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	w.books(t, r.ChargedMicro)
}

// TestNamedRunsFirstCallPausedBetweenItsHoldAndTheForward: the first call of a named run,
// caught by the pause after its admission committed the run's hold. The run has no tally and
// no call on its row, no lease: past run_ttl the peer's reconciler charges what it held.
func TestNamedRunsFirstCallPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w, g, _, key := newPausedWorld(t, "paused-run-first")
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Run-Id": "agent-1", "X-Fake-Chunks": "12"}, w.latestHold())
	t.Logf("run settled %s charged %d held %d calls %d; caller %d %s", r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.Calls, s.status, s.code)
	if r.ChargedMicro > 0 && !s.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its run charged %d by %s: charged for a call it was told was not made",
			s.status, s.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	w.books(t, r.ChargedMicro)
}

// TestNamedRunsLaterCallPausedBetweenItsHoldAndTheForward: a later call of a named run whose
// earlier call was answered and tallied, caught by the pause after its admission. Past run_ttl
// the peer's reconciler settles the run from its tally, the earlier call alone: the paused
// call, never forwarded, is charged nothing, and its 503 says so truly.
func TestNamedRunsLaterCallPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w, g, peer, key := newPausedWorld(t, "paused-run-later")
	hdr := map[string]string{"X-Run-Id": "agent-2", "X-Fake-Chunks": "12"}
	w.calls.must(t, "the run's first call", peer, key, chatRequest(false, 40, "the run's first call"), hdr)
	runID := w.latestHold()()
	tl, found, err := w.tally.Get(context.Background(), runID)
	if err != nil || !found || tl.Calls != 1 {
		t.Fatalf("tally of the run after its first call: %+v found %v, %v", tl, found, err)
	}
	tallied := tl.CostMicro
	s, r := pausedBeforeForward(t, w, g, key, hdr, func() string { return runID })
	t.Logf("run settled %s charged %d held %d calls %d (tally %d); caller %d %s", r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.Calls, tallied, s.status, s.code)
	if r.Calls != 1 || r.SettleSource.String == holds.SourceReconcileHold {
		t.Errorf("the run was settled %s for %d calls at %d: want its one answered call's tally", r.SettleSource.String, r.Calls, r.ChargedMicro)
	}
	if s.complete {
		t.Errorf("the paused call was answered on a run settled without it")
	}
	if n := w.held.calls.Load(); n != 1 {
		t.Errorf("the upstream got %d calls, want the first alone", n)
	}
	w.books(t, r.ChargedMicro)
}

// TestPlainCallPausedBetweenItsHoldAndTheForwardUnderTheDedupWindow is
// TestGatewayPausedBetweenItsHoldAndTheForward with the fingerprint window on, as it is by
// default (dedup.window 5 s): the paid call's duplicate check, after its hold, must not run
// under its spent admission budget, or it fails at once and the call it paid for is refused
// 503 dedup_unavailable, "not made".
func TestPlainCallPausedBetweenItsHoldAndTheForwardUnderTheDedupWindow(t *testing.T) {
	w, g, _, key := newPausedWorldWith(t, "paused-plain-dedup", map[string]string{"dedup.window": "5s"})
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Fake-Chunks": "12"}, w.latestHold())
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	if !s.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its hold charged %d by %s: charged for a call it was told was not made",
			s.status, s.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	w.books(t, r.ChargedMicro)
}

// TestIdempotentCallPausedBetweenItsHoldAndTheForward: an Idempotency-Key attempt caught by the
// pause is forwarded once resumed, its hold charged by the peer's reconciler, and its answer
// pins the key: the caller's retry under the key is that answer replayed, not a second run
// charged again.
func TestIdempotentCallPausedBetweenItsHoldAndTheForward(t *testing.T) {
	w, g, peer, key := newPausedWorld(t, "paused-idem")
	hdr := map[string]string{"Idempotency-Key": "pay-once-1", "X-Fake-Chunks": "12"}
	s, r := pausedBeforeForward(t, w, g, key, hdr, w.latestHold())
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	if !s.complete {
		t.Fatalf("the caller was answered %d %s, its attempt charged %d: charged for a call it was told was not made", s.status, s.code, r.ChargedMicro)
	}
	again := w.calls.call(peer, key, chatRequest(false, 40, "the call whose gateway the pause catches"), hdr)
	if !again.complete || !again.replayed || !bytes.Equal(again.body, s.body) {
		t.Errorf("the retry under the key: %d %s replayed %v (same answer %v); want the paid answer replayed", again.status, again.code, again.replayed, bytes.Equal(again.body, s.body))
	}
	if n := w.held.calls.Load(); n != 1 {
		t.Errorf("the upstream got %d calls, want 1", n)
	}
	w.books(t, r.ChargedMicro)
}

// TestCallPausedBeforeItsForwardSweptAsADeadProcesssSoonerThanItsBound: the pause catches a
// call's process when its last beat is already a few seconds old (a beat failed, or was due),
// and the peer declares it dead once that beat is holds.dead_instance_after old: the call's
// hold is brought in and charged what it held (reconcile_hold) less than dead_instance_after
// after the call arrived. Resumed past admit_timeout, the call must read its hold and be
// forwarded: taking dead_instance_after as the soonest such a charge can come, it did not
// look, and its caller was answered 503, "not made", charged.
//
// The beats are 2.5 s apart (lease_ttl 5 s, dead_instance_after the least that allows, 13 s):
// the sweep brings in a hold admitted up to the beat gap (2 × 2.5 s + 5 s = 10 s) after the
// last beat, so the call, sent once that beat is 4 s old, has 6 s to be admitted. At the
// worlds' 0.5 s it had 2 s, and a loaded machine's slower request was admitted past the gap:
// its hold was no dead process's to sweep, and lived its 60 s.
func TestCallPausedBeforeItsForwardSweptAsADeadProcesssSoonerThanItsBound(t *testing.T) {
	const deadAfter = 13 * time.Second
	w, g, _, key := newPausedWorldWith(t, "paused-swept", map[string]string{"holds.hold_ttl": "60s", "holds.run_ttl": "60s",
		"holds.tally_ttl": "2h", "holds.heartbeat_interval": "2500ms", "holds.lease_ttl": "5s", "holds.dead_instance_after": deadAfter.String()})
	staleFor := func(name, column string) time.Duration {
		var us int64
		_ = w.db.Get(&us, "SELECT COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, "+column+", NOW(6))), 0) FROM instances WHERE name = ? AND dead_at IS NULL", name)
		return time.Duration(us) * time.Microsecond
	}
	// The peer declares others dead only once it has beaten for the bound itself.
	waitFor(t, 40*time.Second, "the peer beating for dead_instance_after", func() bool { return staleFor("gw-peer", "started_at") > deadAfter+time.Second })
	w.relay.dropBeats.Store(true)
	// Admitted before its beat's gap (2 × heartbeat_interval + 5 s) has passed, the hold is one
	// the sweep brings in; its beat then turns dead_instance_after old 9 s after, sooner than
	// the 13 s from the call's arrival that the call once took for the soonest.
	waitFor(t, 20*time.Second, "the paused gateway's last beat 4 s old", func() bool { return staleFor("gw-paused", "beat_at") > 4*time.Second })
	s, r := pausedBeforeForward(t, w, g, key, map[string]string{"X-Fake-Chunks": "12"}, w.latestHold())
	w.relay.dropBeats.Store(false)
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("the scene did not happen: the hold settled %s at %d", r.SettleSource.String, r.ChargedMicro)
	}
	if !s.complete {
		t.Errorf("the caller was answered %d %s (the upstream got %d calls), its hold charged %d by %s: charged for a call it was told was not made",
			s.status, s.code, w.held.calls.Load(), r.ChargedMicro, r.SettleSource.String)
	}
	w.books(t, r.ChargedMicro)
}
