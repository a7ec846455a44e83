package proxy_test

import (
	"net"
	"net/http"
	"testing"

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
// idempotent_response_lost: one upstream call, one charge. A whole body and a stream alike.
func TestIdemAnswerNotStoredThenKilledIsNotRunAgain(t *testing.T) {
	for _, tc := range []struct{ name, body string }{{"chat", chatBody}, {"chat stream", streamBody}} {
		t.Run(tc.name, func(t *testing.T) { answerNotStoredThenKilled(t, tc.body) })
	}
}

func answerNotStoredThenKilled(t *testing.T, body string) {
	answer := &failingWrites{marker: []byte("\r\nctype\r\n")}  // only the stored answer has this field
	tally := &failingWrites{marker: []byte("\r\nhincrby\r\n")} // the run's tally (its reads go on)
	h := newHarnessOn(t, harnessSetup{
		redisDialer: wrappedDialer(func(c net.Conn) net.Conn {
			return &failingWritesConn{Conn: &failingWritesConn{Conn: c, f: answer}, f: tally}
		}),
		contextTimeouts: true,
	}, nil)
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

	for i := range 2 { // a second retry must not find what the first left and run
		retry := send(h.gw.URL, key, body, idem)
		if retry.status != http.StatusConflict || errorCode(t, []byte(retry.body)) != "idempotent_response_lost" {
			t.Fatalf("retry %d of an answered attempt whose answer Redis refused, killed before its settlement: %d %s; want 409 idempotent_response_lost",
				i, retry.status, retry.body)
		}
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1: the answered attempt ran again", n)
	}
	release()
	h.settled()
	runs := h.expectCharges(u.ID, []string{attempt0})
	for _, r := range runs {
		if r.RunID == attempt0 && r.SettleSource.String != holds.SourceReconcile {
			t.Errorf("killed attempt settled %s, want %s (from the call its row recorded)", r.SettleSource.String, holds.SourceReconcile)
		}
	}
}
