package proxy_test

import (
	"context"
	"crypto/sha256"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// claimedByADeadProcess commits a claim of session sid for a newer message's run, as the
// process serving that message does, and publishes no cancel: that process was killed between
// its claim's COMMIT and the publish (README Known limits, before the session check). It
// returns the run the claim replaced.
func claimedByADeadProcess(t *testing.T, h *harness, userID uint64, sid string) string {
	t.Helper()
	claim, err := h.store.ClaimSession(context.Background(), userID, sid, "r_newer_message_of_"+sid, sha256.Sum256([]byte("newer "+sid)))
	if err != nil {
		t.Fatal(err)
	}
	return claim.Replaced
}

// TestSessionRunWhoseCancelNeverCameIsStoppedByTheSessionCheck: a newer message took the
// session of a running call, and its process died before it sent the cancel. The old run went
// on to its end, charged in full beside the newer message. The process serving it now finds
// it replaced by the session's row and stops it, charged what it used; a session run that is
// still current is left running.
func TestSessionRunWhoseCancelNeverCameIsStoppedByTheSessionCheck(t *testing.T) {
	// The test runs the check itself: a tick of its own could otherwise come first.
	h := newHarnessOn(t, harnessSetup{sessionCheckInterval: -1}, nil)
	u, key := h.user("standard")
	aRun, br := runningSessionStream(t, h, key, "replaced")
	current := longSessionStream(t, h.gw.URL, key, "current")
	if replaced := claimedByADeadProcess(t, h, u.ID, "replaced"); replaced != aRun {
		t.Fatalf("the newer message's claim replaced %q, want the running call %s", replaced, aRun)
	}
	n, err := h.srv.CheckSessions(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("session check stopped %d runs (%v); want 1, the replaced one, and not the current one", n, err)
	}
	if n, err := h.srv.CheckSessions(context.Background()); err != nil || n != 0 {
		t.Fatalf("second session check stopped %d runs (%v); want none: the current run runs on", n, err)
	}
	current.Body.Close() // its caller leaves: the test need not wait out its 15 s
	endsSuperseded(t, h, u, aRun, br, "replaced by a message whose process died before its cancel")
}

// TestSessionCheckRunsOnItsOwn: the check runs every holds.heartbeat_interval without being
// asked: a run whose cancel never came stops within a few intervals, counted in
// tollgate_session_check_stops_total (a lost cancel an operator should hear of).
func TestSessionCheckRunsOnItsOwn(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Holds.HeartbeatInterval = 100 * time.Millisecond })
	u, key := h.user("standard")
	aRun, br := runningSessionStream(t, h, key, "replaced")
	claimedByADeadProcess(t, h, u.ID, "replaced")
	// The stream is 15 s long (longSessionChunks); endsSuperseded fails if it ends whole.
	endsSuperseded(t, h, u, aRun, br, "replaced by a message whose process died before its cancel, the check left to its interval")
	if got := h.metric("tollgate_session_check_stops_total"); got != "1" {
		t.Fatalf("tollgate_session_check_stops_total %q, want 1", got)
	}
}

// TestSessionCheckLeavesARunWhoseClaimHasNotCommitted: a call is registered on the bus before
// its session claim commits, while the session's row still names the run it is about to
// replace. Judged by the row then, the check would stop the newer message's own call.
func TestSessionCheckLeavesARunWhoseClaimHasNotCommitted(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	aRun, br := runningSessionStream(t, h, key, "s")
	claiming, resume := h.holdAtFirst("session claim")
	b := make(chan answer, 1)
	go func() {
		b <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"B: another question"}]}`,
			map[string]string{proxy.SessionHeader: "s"})
	}()
	<-claiming
	n, err := h.srv.CheckSessions(context.Background())
	resume()
	if err != nil || n != 0 {
		t.Fatalf("session check during B's claim stopped %d runs (%v); want none", n, err)
	}
	if got := <-b; got.status != http.StatusOK {
		t.Fatalf("B: %d %s; want it answered", got.status, got.body)
	}
	endsSuperseded(t, h, u, aRun, br, "replaced by B")
}

// TestSessionCheckLeavesAnAnswerAlreadyWhole: once a session call's answer is whole, the same
// message again (a regenerate) claims the session past it while the call still sends its last
// bytes; the row then names the regenerate's run. The check must not take the whole answer
// for replaced and cut its end.
func TestSessionCheckLeavesAnAnswerAlreadyWhole(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	sess := map[string]string{proxy.SessionHeader: "regen"}
	a, resume := sentUntilItsAnswerIsWhole(h, key, sess)
	b := send(h.gw.URL, key, streamBody, sess)
	if b.status != http.StatusOK {
		resume()
		t.Fatalf("regenerate: %d %s; want it run", b.status, b.body)
	}
	n, err := h.srv.CheckSessions(context.Background())
	resume()
	if err != nil || n != 0 {
		t.Fatalf("session check with A's answer whole stopped %d runs (%v); want none", n, err)
	}
	got := <-a
	if got.status != http.StatusOK || !strings.Contains(string(got.body), "[DONE]") || strings.Contains(string(got.body), "superseded") {
		t.Fatalf("A: %d ...%s; want its whole stream", got.status, got.body[max(0, len(got.body)-200):])
	}
	h.settled()
	if run := h.run(u.ID, got.header.Get(proxy.RunIDHeader)); run.SettleSource.String != holds.SourceComplete {
		t.Fatalf("A settled %s, want complete", run.SettleSource.String)
	}
}

// TestSessionAnswerAlreadyWholeIsNotCutByANewerMessage: a different message sent the moment a
// session call's answer is whole (its end marked, its last bytes not yet sent, its hold not yet
// settled) takes the session from a call that has nothing left to stop. Its cancel cut the
// answer's end: the caller got a superseded error event after a whole answer, or in place of
// its [DONE].
func TestSessionAnswerAlreadyWholeIsNotCutByANewerMessage(t *testing.T) {
	for _, tc := range []struct {
		name, end string
		hdr       map[string]string
	}{
		{"whole", "[DONE]", nil},
		{"ended by the provider's error event", `"error"`, map[string]string{fakellm.HeaderChunks: "6", fakellm.HeaderErrorAfter: "3"}},
		{"broken after output", "upstream_broken", map[string]string{fakellm.HeaderChunks: "6", fakellm.HeaderDropAfter: "3"}},
	} {
		t.Run(tc.name, func(t *testing.T) { answerWholeNotCut(t, tc.hdr, tc.end) })
	}
}

func answerWholeNotCut(t *testing.T, hdr map[string]string, end string) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	sess := map[string]string{proxy.SessionHeader: "next"}
	aHdr := map[string]string{proxy.SessionHeader: "next"}
	maps.Copy(aHdr, hdr)
	a, resume := sentUntilItsAnswerIsWhole(h, key, aHdr)
	b := send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"B: the next question"}]}`, sess)
	resume()
	if b.status != http.StatusOK {
		t.Fatalf("B: %d %s; want it run", b.status, b.body)
	}
	got := <-a
	if got.status != http.StatusOK || !strings.Contains(string(got.body), end) || strings.Contains(string(got.body), "superseded") {
		t.Fatalf("A: %d ...%s; want its stream to its end (%s), not cut", got.status, got.body[max(0, len(got.body)-300):], end)
	}
	h.settled()
	if run := h.run(u.ID, got.header.Get(proxy.RunIDHeader)); run.SettleSource.String == holds.SourceCancel {
		t.Fatalf("A settled %s, want as it ended", run.SettleSource.String)
	}
}

// sentUntilItsAnswerIsWhole sends a stream with hdr and holds its call once its answer is
// whole (answerFinal: its session's end marked, its last bytes not yet sent) until resume is
// called; it returns once the call is held there, with the channel its answer comes on.
func sentUntilItsAnswerIsWhole(h *harness, key string, hdr map[string]string) (<-chan answer, func()) {
	final, resume := h.holdAtFirst("answer final")
	a := make(chan answer, 1)
	go func() { a <- send(h.gw.URL, key, streamBody, hdr) }()
	<-final
	return a, resume
}

// TestSessionCheckLeavesARunSettledBeforeItsSessionMovedOn: a session call whose hold a
// reconciler settled (its process paused past its holds' expiry, taken for dead), and whose
// message was sent again after that, on another process: that claim replaced nothing
// (SessionClaim.Replaced is empty, no cancel went out), and the resumed call's caller, still
// connected, gets its whole answer (README Known limits). The check must not cut it because
// the row names the newer run. Mutant: the open-hold condition dropped (the e2e flake of
// TestGatewayPausedPastItsHolds, "s-same #1 ... superseded").
func TestSessionCheckLeavesARunSettledBeforeItsSessionMovedOn(t *testing.T) {
	h := newHarnessOn(t, harnessSetup{sessionCheckInterval: -1}, nil)
	u, key := h.user("standard")
	aRun, _ := runningSessionStream(t, h, key, "reconciled")
	if _, err := h.store.Settle(context.Background(), holds.Settlement{RunID: aRun, UserID: u.ID, CostMicro: 1000,
		Source: holds.SourceReconcileHold}); err != nil {
		t.Fatal(err)
	}
	if replaced := claimedByADeadProcess(t, h, u.ID, "reconciled"); replaced != "" {
		t.Fatalf("a claim after the run was settled replaced %q, want nothing", replaced)
	}
	if n, err := h.srv.CheckSessions(context.Background()); err != nil || n != 0 {
		t.Fatalf("session check stopped %d runs (%v); want none: the run was settled before its session moved on", n, err)
	}
}
