package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// A session's new message whose caller leaves while its claim commits has still replaced the
// running message: the old run must be told to stop. Told with the leaving caller's context,
// the cancel was never sent, and the old run ran to its end and was charged in full while the
// session pointed at the new one (so the old message, sent again, ran a second time).
func TestSessionCallLeavingMidClaimStillStopsTheOldOne(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db}, nil)
	u, key := h.user("standard")
	// A second handle on the same database, around the lossy network.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp"
	plain, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })

	// A: a long stream in session s.
	resp := h.post(key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`,
		map[string]string{"X-Session-Id": "s", fakellm.HeaderChunks: "2000", fakellm.HeaderChunkInterval: "5ms"})
	defer resp.Body.Close()
	oldRun := resp.Header.Get(proxy.RunIDHeader)
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	// B's claim is made to wait on the session row, then its COMMIT's reply comes late, and
	// B's caller leaves while it is on its way.
	lock := testenv.ConsoleTx(t, plain)
	var sid string
	if err := lock.Get(&sid, "SELECT session_id FROM sessions WHERE user_id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	bctx, leave := context.WithCancel(context.Background())
	defer leave()
	breq, _ := http.NewRequestWithContext(bctx, http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	breq.Header.Set("Authorization", "Bearer "+key)
	breq.Header.Set("X-Session-Id", "s")
	bdone := make(chan error, 1)
	go func() {
		r, err := http.DefaultClient.Do(breq)
		if err == nil {
			_, err = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		bdone <- err
	}()
	waitForStatement(t, plain, "INSERT INTO sessions")
	lossy.Arm("COMMIT", testenv.LateReply)
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B's claim committing", lossy.Fired)
	leave()
	<-bdone

	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("old stream did not end as superseded: ...%s", rest[max(0, len(rest)-300):])
	}
	h.settled()
	if run := h.run(u.ID, oldRun); run.SettleSource.String != holds.SourceCancel || run.OutTok >= 2000 {
		t.Fatalf("old run = %+v, want settled by cancel with its partial output", run)
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A caller that leaves while its session claim waits is a client that closed the request
// (499), not billing down (503): the claim's failure is the caller's cancelled context. Its
// hold is released at 0 and the session's running message goes on.
func TestSessionCallLeavingDuringClaimIsClientClosed(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := sendOK(t, "first message", h.gw.URL, key, chatBody, map[string]string{"X-Session-Id": "s"})
	lock := testenv.ConsoleTx(t, h.db)
	var sid string
	if err := lock.Get(&sid, "SELECT session_id FROM sessions WHERE user_id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	sendThenLeave(t, h, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"a second message"}]}`,
		map[string]string{"X-Session-Id": "s"}, "INSERT INTO sessions")
	expectClientClosed(t, h)
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	h.settled()
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)}, holds.SourceRelease)
}

// A named run's call whose caller leaves while its admission waits on the user's row is a
// client that closed the request (499): its run budget reservation fails on the caller's
// cancelled context, which is not Redis being down (503).
func TestRunCallLeavingDuringAdmissionIsClientClosed(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	lock := testenv.ConsoleTx(t, h.db)
	var id uint64
	if err := lock.Get(&id, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	sendThenLeave(t, h, key, chatBody, map[string]string{"X-Run-Id": "job-1"}, "FROM users WHERE id IN%FOR UPDATE")
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	expectClientClosed(t, h)
}

// sendThenLeave sends a request and leaves (cancels it) once a statement like stmt (a LIKE
// pattern) runs on another connection of the database: the request waits on a lock the test
// holds. It returns when the client has given up.
func sendThenLeave(t *testing.T, h *harness, key, body string, hdr map[string]string, stmt string) {
	t.Helper()
	leave, done := sendLeaving(h, key, body, hdr)
	defer leave()
	waitForStatement(t, h.db, stmt)
	leave()
	<-done
}

// sendLeaving sends a chat request in the background; its caller leaves when leave is called.
// done is closed once the request has ended.
func sendLeaving(h *harness, key, body string, hdr map[string]string) (leave func(), done <-chan struct{}) {
	ctx, leave := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		sendToCtx(ctx, h.gw.URL, "/v1/chat/completions", key, body, hdr)
	}()
	return leave, ended
}

// waitForStatement waits until a statement like stmt (a LIKE pattern) runs on another
// connection of db. Only db's database counts: the server is shared with the other packages'
// tests, running at the same time, whose statements (and whose own PROCESSLIST polls, which
// carry the pattern) are not this test's request.
func waitForStatement(t *testing.T, db *sqlx.DB, stmt string) {
	t.Helper()
	waitForStatements(t, db, stmt, 1)
}

// waitForStatements waits until at least n statements like stmt run (or wait for a lock) on
// connections other than the watcher's: claims queued on one row's lock, in the order they came.
func waitForStatements(t *testing.T, db *sqlx.DB, stmt string, n int) {
	t.Helper()
	waitFor(t, strconv.Itoa(n)+" statements like "+stmt, func() bool {
		var got int
		err := db.Get(&got, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'`, "%"+stmt+"%")
		return err == nil && got >= n
	})
}

// expectClientClosed asserts that one chat call was counted as its client closing the
// request (499), and none as the gateway's failure (503).
func expectClientClosed(t *testing.T, h *harness) {
	t.Helper()
	waitFor(t, "the call to be counted", func() bool {
		return h.metric(`tollgate_requests_total{code="499",route="/v1/chat/completions"}`) == "1"
	})
	if got := h.metric(`tollgate_requests_total{code="503",route="/v1/chat/completions"}`); got != "" {
		t.Errorf("a caller that left was counted as %s answers of 503 billing_unavailable", got)
	}
}
