package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestLongPromptWhoseSmallHoldsReleaseFailedIsRefusedNotAdmittedAgain: a long prompt whose
// hold, granted while its user's answered call settled, was too small is released at 0 before
// it waits for that settlement (admitFitting). When that release fails (its write sent, its
// reply and the database lost to it), the hold is handed on as a lost admission's, released in
// the background, and the call is refused at once (releaseUnfit): it does not wait for the
// settlement nor take a second hold, though its admission's budget had time left for both, and
// nothing is forwarded. The small hold ends released at 0. The database stopped it, not its
// credits: it is answered 503 billing_unavailable, which the SDKs retry, not 402 for its
// prompt, which they do not.
func TestLongPromptWhoseSmallHoldsReleaseFailedIsRefusedNotAdmittedAgain(t *testing.T) {
	h, lossy, logs := newObservedLossyHarness(t, func(c *config.Config) {
		aLittleOverTheTier(c)
		// The release gives up (one try of settle_timeout) long before the admission's budget
		// ends: a call admitted again after it would have the time to be.
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = 10*time.Second, 500*time.Millisecond
	})
	defer lossy.Restore()
	u, key := h.user("standard")
	var waited atomic.Bool
	answered := firstCallSettling(t, h, key, func(_ context.Context, step string) {
		if step == "admission waits for a settlement" {
			waited.Store(true)
			lossy.Restore() // the database back for an admission again, were there one
		}
	})
	calls := h.fake.Calls()
	// The first call's settlement is held at its step: the next settlement's write is the long
	// prompt's small hold's release. It reaches the database; its reply, and every write after
	// it, is lost until Restore.
	lossy.Arm("settle_token) VALUES", testenv.GoDown)
	longRefusedAsItsReleaseFails(t, h, key, lossy, logs, answered)
	if waited.Load() {
		t.Errorf("the long prompt waited for a settlement after its small hold's release failed; want it refused at once")
	}
	smallHoldReleasedUnforwarded(t, h, u.ID, calls)
}

// TestDrainCutWhileReleasingAHoldTooSmallForItsPromptIsToldShuttingDown: the drain's deadline
// cuts a long prompt while its small hold's release (releaseUnfit) waits on a database slow to
// answer. The wait ends, and the caller, still there, is told 503 shutting_down: the cut, not
// the database, stopped it. The server's cut ended the request and the release's wait each in
// a goroutine of its own, and a refusal that looked at the request before its cut landed told
// the caller 503 billing_unavailable (seen in CI, about one run in ten under load). The caller
// is told at the cut, long before the database answers, so within the grace a graceful
// shutdown gives a cut call before it closes its connection (cutGrace in cmd/gateway, 2 s):
// holds.Writer.Settle waits for a batch that has taken its settlement whatever its context
// says, and a release waited for there answered the cut caller only once the database did,
// in a real drain never, its connection closed first. Nothing is forwarded, and the small hold
// ends released at 0.
func TestDrainCutWhileReleasingAHoldTooSmallForItsPromptIsToldShuttingDown(t *testing.T) {
	h, lossy, _ := newObservedLossyHarness(t, func(c *config.Config) {
		aLittleOverTheTier(c)
		// Neither ends the release's wait before the cut does.
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = 30*time.Second, 30*time.Second
	})
	defer lossy.Restore()
	u, key := h.user("standard")
	answered := firstCallSettling(t, h, key, nil)
	calls := h.fake.Calls()
	// The first call's settlement is held at its step: the next settlement's write is the long
	// prompt's small hold's release. A batch runs it; its reply is held until the test lets it
	// go, so an answer that comes while it is held came before the database's reply.
	releaseReply := lossy.ArmHeld("settle_token) VALUES")
	longAnswer := make(chan answer, 1)
	go func() { longAnswer <- send(h.gw.URL, key, longPromptBody(3000), nil) }()
	waitFor(t, "the small hold's release sent", lossy.Fired)
	h.srv.CutCalls()
	var long answer
	select {
	case long = <-longAnswer:
	case <-time.After(20 * time.Second): // a watchdog: the cut answers at once
		releaseReply()
		long = <-longAnswer
		t.Errorf("the long prompt, cut while its small hold's release was out, was answered only once the database replied (held 20 s); want at the cut")
	}
	releaseReply()
	close(answered)
	if long.status != http.StatusServiceUnavailable || errorCode(t, long.body) != "shutting_down" || !toldNothingCharged(string(long.body)) {
		t.Errorf("the long prompt, cut while its small hold's release was out: %d %s; want 503 shutting_down, nothing charged", long.status, long.body)
	}
	smallHoldReleasedUnforwarded(t, h, u.ID, calls)
}

// longRefusedAsItsReleaseFails sends the long prompt while the first call's settlement is
// held (answered ends that hold) and lossy, armed by the caller, fails its small hold's
// release; it checks the release went out, failed, and the call was refused 503
// billing_unavailable: the database stopped it, not its credits.
func longRefusedAsItsReleaseFails(t *testing.T, h *harness, key string, lossy *testenv.Lossy,
	logs *observer.ObservedLogs, answered chan struct{}) {
	t.Helper()
	long := send(h.gw.URL, key, longPromptBody(3000), nil)
	fired := lossy.Fired()
	lossy.Restore()
	close(answered)
	if !fired {
		t.Fatalf("the small hold's release never went out (the long prompt: %d %s)", long.status, long.body)
	}
	if logs.FilterMessageSnippet("release of a hold too small for its prompt failed").Len() == 0 {
		t.Fatalf("no failed release logged: the test's premise (the long prompt: %d %s)", long.status, long.body)
	}
	if long.status != http.StatusServiceUnavailable || errorCode(t, long.body) != "billing_unavailable" {
		t.Errorf("the long prompt, its small hold's release failed: %d %s; want 503 billing_unavailable: the database stopped it",
			long.status, long.body)
	}
}

// smallHoldReleasedUnforwarded checks the long prompt of userID, refused, was never forwarded
// (the upstream had calls calls before it), and once the settlements end, that it took no
// second hold and its small one is released at 0.
func smallHoldReleasedUnforwarded(t *testing.T, h *harness, userID uint64, calls int64) {
	t.Helper()
	if n := h.fake.Calls() - calls; n != 0 {
		t.Errorf("the long prompt was forwarded %d times, want never", n)
	}
	h.settled()
	runs := h.holdsOf(userID)
	if len(runs) != 2 {
		t.Fatalf("%d holds, want the first call's and the long prompt's small one: no second hold", len(runs))
	}
	if small := runs[1]; small.State != holds.StateSettled || small.ChargedMicro != 0 {
		t.Errorf("the long prompt's small hold %s: %s by %q charged %d, want released at 0",
			small.RunID, small.State, small.SettleSource.String, small.ChargedMicro)
	}
}

// TestLongPromptWhoseSmallHoldsReleaseNeverRanIsReleasedInTheBackground: as
// TestLongPromptWhoseSmallHoldsReleaseFailedIsRefusedNotAdmittedAgain, but the small hold's
// release never runs at all (every try answered "not ready" before the server runs it), so
// nothing of it lands: only the hand-over to a lost admission's release (releaseRefused),
// which tries again in the background once the database answers, closes the hold. The call is
// refused 503 billing_unavailable, nothing is forwarded, and the small hold ends released at 0
// rather than left running for the reconciler to charge what it held.
func TestLongPromptWhoseSmallHoldsReleaseNeverRanIsReleasedInTheBackground(t *testing.T) {
	h, lossy, logs := newObservedLossyHarness(t, func(c *config.Config) {
		aLittleOverTheTier(c)
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = 10*time.Second, 500*time.Millisecond
	})
	defer lossy.Restore()
	u, key := h.user("standard")
	answered := firstCallSettling(t, h, key, nil)
	calls := h.fake.Calls()
	// The first call's settlement is held at its step: the next settlement's writes are the
	// long prompt's small hold's release, none of which the server runs until Restore.
	lossy.ArmN("settle_token) VALUES", testenv.NotReadyReply, 1_000_000)
	longRefusedAsItsReleaseFails(t, h, key, lossy, logs, answered)
	smallHoldReleasedUnforwarded(t, h, u.ID, calls)
}
