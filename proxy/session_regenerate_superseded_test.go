package proxy_test

import (
	"bufio"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionRegenerateWhoseClaimRetryFindsANewerMessageYieldsToIt: R, a session's message sent
// again once its answer A had ended (a regenerate), finds A's hold still live and claims past it
// (a second claim, told A ended). That claim commits with its COMMIT reply lost, and while it
// backs off a newer message C takes the session from R; C's cancel does not reach R's gateway
// before R's retry (here C's gateway publishes where R's does not listen). The retry reads from
// R's own row that its attempt committed and that C has the session since: Superseded. The
// first claim's answer was checked for it, the second's was not: R, the older message, was
// forwarded and answered beside the newer C. It is now answered 409 superseded, not to be
// retried, and charged nothing, as when the first claim finds it.
func TestSessionRegenerateWhoseClaimRetryFindsANewerMessageYieldsToIt(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	// Room for A's settlement to land before R's claim is let go (see below).
	h := newHarnessOn(t, harnessSetup{db: db}, func(c *config.Config) { c.Limits.AdmitTimeout = 20 * time.Second })
	u, key := h.user("standard")
	session := map[string]string{proxy.SessionHeader: "s"}
	plain := plainHandle(t, dsn)
	other := gatewayOn(h, plain, runstate.Keys{Prefix: h.keys.Prefix + "other:"})

	// A answers M whole; its upstream lingers after [DONE], so its hold is live, its end marked.
	const m = `"messages":[{"role":"user","content":"M: tell me a story"}]`
	a := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,`+m+`}`,
		map[string]string{proxy.SessionHeader: "s", fakellm.HeaderChunks: "5", fakellm.HeaderLinger: "1s"})
	defer a.Body.Close()
	aRun := a.Header.Get(proxy.RunIDHeader)
	toDone(t, bufio.NewReader(a.Body))

	// R, M again: its first claim finds A live, its end marked; its second (past A) is held
	// before it starts.
	var claims atomic.Int32
	past, proceed := make(chan struct{}), make(chan struct{})
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		if step == "session claim" && claims.Add(1) == 2 {
			close(past)
			<-proceed
		}
	})
	r := make(chan answer, 1)
	go func() { r <- send(h.gw.URL, key, `{"model":"fake-gpt",`+m+`}`, session) }()
	select {
	case <-past:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatalf("R never claimed past A (%d claims)", claims.Load())
	}
	// A settles (its COMMIT must not be the one lost below); then R's claim waits on the
	// session row, and once it runs its COMMIT lands and the network goes down with its reply.
	waitFor(t, "A settled", func() bool {
		var state string
		return plain.Get(&state, "SELECT state FROM run_holds WHERE run_id = ?", aRun) == nil && state == "settled"
	})
	lock := testenv.ConsoleTx(t, plain)
	var sid string
	if err := lock.Get(&sid, "SELECT session_id FROM sessions WHERE user_id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	waitForStatement(t, plain, "INSERT INTO sessions")
	lossy.Arm("COMMIT", testenv.GoDown)
	t.Cleanup(lossy.Restore)
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "R's claim committing", lossy.Down)
	var rRun string
	if err := plain.Get(&rRun, "SELECT current_run_id FROM sessions WHERE user_id = ?", u.ID); err != nil || rRun == aRun {
		t.Fatalf("session is on %q (%v), want R's run", rRun, err)
	}

	// C, a newer message, through a gateway that reaches the database, replaces R.
	c := sendOK(t, "C", other, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: a third question"}]}`, session)
	lossy.Restore()

	got := <-r
	if got.status != http.StatusConflict || errorCode(t, got.body) != "superseded" || got.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("R, whose claim's retry found the newer C: %d %s (X-Should-Retry %q); want 409 superseded, X-Should-Retry: false",
			got.status, got.body, got.header.Get("X-Should-Retry"))
	}
	var current string
	if err := plain.Get(&current, "SELECT current_run_id FROM sessions WHERE user_id = ?", u.ID); err != nil || current != c.header.Get(proxy.RunIDHeader) {
		t.Fatalf("session is on %q (%v), want C's run %s", current, err, c.header.Get(proxy.RunIDHeader))
	}
	if run := h.run(u.ID, rRun); run.State != holds.StateSettled || run.ChargedMicro != 0 {
		t.Fatalf("R = %+v, want settled, charged nothing", run)
	}
}
