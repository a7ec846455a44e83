package proxy_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemAnswerNotStoredThenKilledIsNotRunAgain: the double fault. An Idempotency-Key
// attempt is answered 200 whole while Redis refuses both writes of its answer (the one before
// the answer's end and the one at the call's end; the key's record, with its body, was written
// at admission) and its tally; then its process is killed before its settlement commits. The
// reconciler settles the hold (source reconcile, never complete), and the record still in
// Redis holds no answer: the retry took the attempt for one cut before it pinned, ran it again
// and charged the key twice. The attempt's row now records the call before the answer's end
// whenever Redis refused the answer, and the retry, reading it, is refused 409
// idempotent_response_lost: one upstream call, one charge. A whole body and a stream alike, and
// a stream its upstream broke after some output (a stream_error that pins the key), whose
// answer is stored, and refused, only when the call ends (finishIdem), not before its end.
func TestIdemAnswerNotStoredThenKilledIsNotRunAgain(t *testing.T) {
	for _, tc := range []struct{ name, body string }{{"chat", chatBody}, {"chat stream", streamBody}} {
		t.Run(tc.name, func(t *testing.T) { answerNotStoredThenKilled(t, tc.body, nil) })
	}
	t.Run("chat stream cut after output", func(t *testing.T) {
		cut := closeDelimited(t, "text/event-stream",
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half an answer\"}}]}\n\n")
		answerNotStoredThenKilled(t, streamBody, cut)
	})
}

// answerNotStoredThenKilled runs the double fault against the harness's fake upstream, or
// against upstream when it is set.
func answerNotStoredThenKilled(t *testing.T, body string, upstream http.HandlerFunc) {
	answer := &failingWrites{marker: []byte("\r\nctype\r\n")}  // only the stored answer has this field
	tally := &failingWrites{marker: []byte("\r\nhincrby\r\n")} // the run's tally (its reads go on)
	var mutate func(*config.Config)
	var served atomic.Int64 // the calls upstream was sent
	if upstream != nil {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			served.Add(1)
			upstream(w, r)
		}))
		t.Cleanup(srv.Close)
		mutate = func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "cut", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
		}
	}
	h := newHarnessOn(t, harnessSetup{
		redisDialer: wrappedDialer(func(c net.Conn) net.Conn {
			return &failingWritesConn{Conn: &failingWritesConn{Conn: c, f: answer}, f: tally}
		}),
		contextTimeouts: true,
	}, mutate)
	calls := h.fake.Calls
	if upstream != nil {
		calls = served.Load
	}
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "unstored-killed-1"}
	attempt0 := proxy.IdempotentRunID(u.ID, "unstored-killed-1", 0)

	// The attempt's process "dies" as it is about to settle: its settlement goes no further
	// until it is let go, long after the reconciler settled its hold.
	_, release := h.holdAtFirst("settle")

	answer.on.Store(true)
	tally.on.Store(true)
	first := send(h.gw.URL, key, body, idem)
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt0 {
		t.Fatalf("first attempt: %d run %q %s", first.status, first.header.Get(proxy.RunIDHeader), first.body)
	}
	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld+st.FromTally != 1 {
		t.Fatalf("reconcile of the killed attempt: %+v; want it settled", st)
	}
	answer.on.Store(false) // Redis takes writes again
	tally.on.Store(false)

	expectResponseLost(t, h, key, body, idem, calls)
	release()
	h.settled()
	runs := h.expectCharges(u.ID, []string{attempt0})
	for _, r := range runs {
		if r.RunID == attempt0 && r.SettleSource.String != holds.SourceReconcile {
			t.Errorf("killed attempt settled %s, want %s (from the call its row recorded)", r.SettleSource.String, holds.SourceReconcile)
		}
	}
}

// expectResponseLost checks that retries of an answered attempt killed before its settlement,
// whose answer Redis refused, are refused 409 idempotent_response_lost (a second retry must
// not find what the first left and run), the upstream called once in all.
func expectResponseLost(t *testing.T, h *harness, key, body string, idem map[string]string, upstreamCalls func() int64) {
	t.Helper()
	for i := range 2 {
		retry := send(h.gw.URL, key, body, idem)
		if retry.status != http.StatusConflict || errorCode(t, []byte(retry.body)) != "idempotent_response_lost" {
			t.Fatalf("retry %d of an answered attempt whose answer Redis refused, killed before its settlement: %d %s; want 409 idempotent_response_lost",
				i, retry.status, retry.body)
		}
	}
	if n := upstreamCalls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1: the answered attempt ran again", n)
	}
}

// TestIdemAnswerNotStoredThenKilledBeforeTheCallEndsIsNotRunAgain: the double fault of
// TestIdemAnswerNotStoredThenKilledIsNotRunAgain, the process killed earlier: Redis refuses the
// answer's write before its end (pinBeforeAnswer), and the process dies in the second, the
// call's end (finishIdem), the caller having its whole answer. Recorded on the attempt's row
// only by that second write's failure, the attempt was settled by the reconciler from its
// hold and its retry, finding a record without an answer and a row that said nothing of its
// call, ran and was charged again. The row records the call before the answer's end goes out.
func TestIdemAnswerNotStoredThenKilledBeforeTheCallEndsIsNotRunAgain(t *testing.T) {
	stored := &diesOnSecondWrite{marker: []byte("\r\nctype\r\n"), reached: make(chan struct{}), dead: make(chan struct{})}
	tally := &failingWrites{marker: []byte("\r\nhincrby\r\n")}
	h := newHarnessOn(t, harnessSetup{
		redisDialer: wrappedDialer(func(c net.Conn) net.Conn {
			return &failingWritesConn{Conn: &diesOnSecondWriteConn{Conn: c, f: stored}, f: tally}
		}),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "unstored-killed-early"}
	attempt0 := proxy.IdempotentRunID(u.ID, "unstored-killed-early", 0)
	released := false
	release := func() {
		if !released {
			released = true
			close(stored.dead)
		}
	}
	defer release()

	tally.on.Store(true)
	// Past the held store, a settlement is the call's, let go at once; before it, the call never
	// stored its answer again at its end.
	settling, resume := h.holdAtFirst("settle")
	firstDone := make(chan answer, 1)
	// On a connection of its own: the handler of the "dead" process keeps it, and a retry sent
	// on it would wait for that handler.
	go func() {
		firstDone <- send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "unstored-killed-early", "Connection": "close"})
	}()
	select {
	case <-stored.reached: // the process is dead in the call's end, before its settlement
		resume()
	case <-settling:
		t.Fatal("the attempt settles without storing its answer again at the call's end")
	}
	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld+st.FromTally != 1 {
		t.Fatalf("reconcile of the killed attempt: %+v; want it settled", st)
	}
	tally.on.Store(false)
	expectResponseLost(t, h, key, chatBody, idem, h.fake.Calls)
	release()
	if first := <-firstDone; first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt0 {
		t.Fatalf("first attempt: %d run %q %s", first.status, first.header.Get(proxy.RunIDHeader), first.body)
	}
	h.settled()
	h.expectCharges(u.ID, []string{attempt0})
}

// diesOnSecondWrite fails the first write to Redis that carries marker, as a Redis blip would,
// and holds the second until dead is closed (the process killed in it; reached says it got
// there), then fails it too. Later ones go through: Redis is back.
type diesOnSecondWrite struct {
	marker        []byte
	n             atomic.Int32
	reached, dead chan struct{}
}

type diesOnSecondWriteConn struct {
	net.Conn
	f *diesOnSecondWrite
}

func (c *diesOnSecondWriteConn) Write(b []byte) (int, error) {
	if !bytes.Contains(b, c.f.marker) {
		return c.Conn.Write(b)
	}
	switch c.f.n.Add(1) {
	case 1:
		return 0, errors.New("redis blip")
	case 2:
		close(c.f.reached)
		<-c.f.dead
		return 0, errors.New("redis blip")
	}
	return c.Conn.Write(b)
}

// TestIdemAnswersRowRecordThatFailedIsTriedAgainAtTheCallsEnd: the double fault of
// TestIdemAnswerNotStoredThenKilledIsNotRunAgain, with the last resort failing once too. Redis
// refuses both stores of an answered attempt's answer (before its end, and at the call's end),
// and the database refuses the first record of its call on the attempt's row, made before the
// answer's end (recordAnsweredAttempt). A record that failed is not one made: the call's end,
// its answer's store refused again, records the call then. Its process killed before its
// settlement, the reconciler settles the hold, and the retry, finding a record without an
// answer, reads the row and is refused 409 idempotent_response_lost: one upstream call, one
// charge. Taken as made, the record was not tried again, the row said nothing of the call, and
// the retry took the attempt for one cut before it pinned, ran the key again and charged it twice.
func TestIdemAnswersRowRecordThatFailedIsTriedAgainAtTheCallsEnd(t *testing.T) {
	// The first answer's store fails, the second is held until the row takes records again, then fails too.
	stored := &diesOnSecondWrite{marker: []byte("\r\nctype\r\n"), reached: make(chan struct{}), dead: make(chan struct{})}
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &diesOnSecondWriteConn{Conn: c, f: stored} }),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	const idemKey = "row-record-failed"
	attempt0 := proxy.IdempotentRunID(u.ID, idemKey, 0)
	// The database refuses every call's record (only RecordRunCall inserts into run_calls),
	// until the trigger is dropped.
	if _, err := h.db.Exec(`CREATE TRIGGER refuse_run_calls BEFORE INSERT ON run_calls FOR EACH ROW
		SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'test: call records refused'`); err != nil {
		t.Fatal(err)
	}
	refusing := true
	accept := func() {
		if refusing {
			refusing = false
			if _, err := h.db.Exec("DROP TRIGGER refuse_run_calls"); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer accept()
	let := sync.OnceFunc(func() { close(stored.dead) })
	defer let()
	settling, release := h.holdAtFirst("settle") // the process "dies" as it is about to settle

	firstDone := make(chan answer, 1)
	go func() {
		firstDone <- send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey, "Connection": "close"})
	}()
	select {
	case <-stored.reached: // the call's end, the record before the answer's end refused
	case <-settling:
		t.Fatal("the attempt settles without storing its answer at the call's end")
	}
	if calls := endedCalls(t, h, attempt0); calls != 0 {
		t.Fatalf("the attempt's row records %d calls while the database refused them, want 0", calls)
	}
	accept()
	let()
	<-settling
	if calls := endedCalls(t, h, attempt0); calls != 1 {
		t.Fatalf("the attempt's row records %d calls once its call ended, want its answered call", calls)
	}
	if st := h.reconcileExpired(t, "run_id = ?", attempt0); st.ChargedHeld+st.FromTally != 1 {
		t.Fatalf("reconcile of the killed attempt: %+v; want it settled", st)
	}
	expectResponseLost(t, h, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey}, h.fake.Calls)
	release()
	if first := <-firstDone; first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt0 {
		t.Fatalf("first attempt: %d run %q %s", first.status, first.header.Get(proxy.RunIDHeader), first.body)
	}
	h.settled()
	h.expectCharges(u.ID, []string{attempt0})
}

// endedCalls is the calls runID's row records (RecordRunCall).
func endedCalls(t *testing.T, h *harness, runID string) int {
	t.Helper()
	var n int
	if err := h.db.Get(&n, "SELECT ended_calls FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	return n
}
