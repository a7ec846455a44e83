package proxy_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestWaitedSessionClaimWhoseRetryFindsAnOlderMessageStopsWhatItReplaced: R, a session's
// message whose admission waited for a settlement, claims the session from its running message
// A (ClaimSessionFrom, from A); the attempt commits, its COMMIT reply lost. Before R's retry,
// N, an older message of the session this process serves (its request arrived before R's),
// claims the session from R. The retry answers Superseded, with A, what R's committed attempt
// replaced: R is the older claim now, and must neither run nor take the session back, and A
// must be told to stop. Claimed again over the older message's run (as a superseded claim
// replacing nothing is), the answer naming A was dropped: R took the session back from N and
// ran, N was stopped, and A, which nothing told to stop, ran to its end, charged in full.
func TestWaitedSessionClaimWhoseRetryFindsAnOlderMessageStopsWhatItReplaced(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	// The session check is off: it stops a replaced run its cancel never reached, and would
	// hide a claim that failed to cancel what it replaced (its own tests: session_check_test.go).
	h := newHarnessOn(t, harnessSetup{db: db, sessionCheckInterval: -1}, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 3 // A, N and X's settlement: R waits for X's
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	plain := plainHandle(t, dsn)
	session := map[string]string{proxy.SessionHeader: "s"}

	nAtClaim, nClaimed := make(chan struct{}), make(chan struct{})
	letX, letN, letNOn := make(chan struct{}), make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { // a call still held lets go when the test ends
		for _, g := range []chan struct{}{letX, letN, letNOn} {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	})
	var claims, settles, waits atomic.Int32
	var nClaim atomic.Pointer[context.Context] // N's claim's context: A's claim was the first
	h.srv.ObserveSteps(func(ctx context.Context, step string) {
		switch step {
		case "session claim":
			if claims.Add(1) == 2 {
				nClaim.Store(&ctx)
				close(nAtClaim)
				<-letN
			}
		case "session claimed":
			if p := nClaim.Load(); p != nil && *p == ctx {
				// N's claim has committed; it has not told R to stop yet.
				close(nClaimed)
				<-letNOn
			}
		case "settle":
			if settles.Add(1) == 1 { // X's
				<-letX
			}
		case "admission waits for a settlement":
			waits.Add(1)
		}
	})

	a := h.post(key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`,
		map[string]string{proxy.SessionHeader: "s", fakellm.HeaderChunks: strconv.Itoa(aChunks), fakellm.HeaderChunkInterval: "5ms"})
	t.Cleanup(func() { a.Body.Close() })
	if a.StatusCode != http.StatusOK {
		t.Fatalf("A: %d", a.StatusCode)
	}
	sc := &claimLostScene{h: h, userID: u.ID, plain: plain, aRun: a.Header.Get(proxy.RunIDHeader), a: bufio.NewReader(a.Body)}
	if _, err := sc.a.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	sendOK(t, "X", h.gw.URL, key, chatBody, nil)
	// The session's row is locked while R's and N's claims queue on it, R's first.
	lock := testenv.ConsoleTx(t, plain)
	var sid string
	if err := lock.Get(&sid, "SELECT session_id FROM sessions WHERE user_id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	n := make(chan answer, 1)
	go func() {
		n <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"N: a second question"}]}`, session)
	}()
	reach(t, nAtClaim, "N's claim")
	r := make(chan answer, 1)
	go func() {
		r <- send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"R: a third question"}]}`, session)
	}()
	waitFor(t, "R to wait for a settlement", func() bool { return waits.Load() == 1 })
	close(letX)
	waitForStatements(t, plain, "INSERT INTO sessions", 1)
	close(letN)
	waitForStatements(t, plain, "INSERT INTO sessions", 2)
	// R's attempt commits, its reply lost; N, next on the row's lock, claims the session from R
	// before R's retry reads it.
	lossy.Arm("COMMIT", testenv.LoseReply)
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	reach(t, nClaimed, "N's claim's answer")
	got := <-r
	if !lossy.Fired() {
		t.Fatal("R's claim's COMMIT reply was never lost")
	}
	if got.status != http.StatusConflict || errorCode(t, got.body) != "superseded" {
		t.Fatalf("R, whose claim's retry found N's claim since its committed attempt: %d %s; want 409 superseded",
			got.status, got.body)
	}
	close(letNOn)
	nAnswer := <-n
	if nAnswer.status != http.StatusOK {
		t.Fatalf("N, the session's current run: %d %s; want 200", nAnswer.status, nAnswer.body)
	}
	sc.aStopped(t, "A, replaced by R's committed attempt")
	var current string
	if err := plain.Get(&current, "SELECT current_run_id FROM sessions WHERE user_id = ?", u.ID); err != nil || current != nAnswer.header.Get(proxy.RunIDHeader) {
		t.Fatalf("session is on %q (%v), want N's run %s", current, err, nAnswer.header.Get(proxy.RunIDHeader))
	}
}

// reach waits for ch to close: a call held at a step has reached it.
func reach(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
