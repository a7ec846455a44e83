package proxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// failingWrites fails, while on, every write to Redis that carries marker, as a Redis blip
// would fail it.
type failingWrites struct {
	marker []byte
	on     atomic.Bool
}

type failingWritesConn struct {
	net.Conn
	f *failingWrites
}

func (c *failingWritesConn) Write(b []byte) (int, error) {
	if c.f.on.Load() && bytes.Contains(b, c.f.marker) {
		return 0, errors.New("redis blip")
	}
	return c.Conn.Write(b)
}

// newAnswerUnstoredHarness is a harness whose Redis writes of a stored answer fail while
// blip is on (off until the test turns it on), and none other.
func newAnswerUnstoredHarness(t *testing.T) (blip *failingWrites, h *harness) {
	blip = &failingWrites{marker: []byte("\r\nctype\r\n")} // only the stored answer has this field
	h = newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: blip} }),
		contextTimeouts: true,
	}, nil)
	return blip, h
}

// TestIdemAnswerNotStoredIsNotRunAgain: an Idempotency-Key attempt answered 200 whose answer
// could not be stored (Redis failed that one write; the key's record, with its body, was
// written) pinned the key all the same: its retry must not run and be charged again. The
// retry found the record without an answer and took the attempt for one that had not pinned;
// it now reads the attempt's row, as it does when the record itself was lost, and answers
// 409 idempotent_response_lost.
func TestIdemAnswerNotStoredIsNotRunAgain(t *testing.T) {
	blip, h := newAnswerUnstoredHarness(t)
	u, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "unstored-1"}

	blip.on.Store(true)
	first := sendOK(t, "first attempt", h.gw.URL, key, chatBody, idem)
	h.settled()
	blip.on.Store(false)

	h.postRefused(t, key, "/v1/chat/completions", chatBody, idem, http.StatusConflict, "idempotent_response_lost")
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
}

// failingNthWrite fails the nth write to Redis that carries marker, as a Redis blip would;
// the others go through.
type failingNthWrite struct {
	marker []byte
	nth    int32
	n      atomic.Int32
}

type failingNthWriteConn struct {
	net.Conn
	f *failingNthWrite
}

func (c *failingNthWriteConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.f.marker) && c.f.n.Add(1) == c.f.nth {
		return 0, errors.New("redis blip")
	}
	return c.Conn.Write(b)
}

// TestIdemAnswerWhoseFirstStoreFailedIsStoredAtTheCallsEnd: Redis refused an Idempotency-Key
// answer's store before its end (pinBeforeAnswer), and took the store at the call's end
// (finishIdem). The first failure records the call on the attempt's row, the last resort; it
// must not stand for the answer's store, or the key, its answer never kept, was refused 409
// idempotent_response_lost for replay_ttl when Redis could have replayed it.
func TestIdemAnswerWhoseFirstStoreFailedIsStoredAtTheCallsEnd(t *testing.T) {
	blip := &failingNthWrite{marker: []byte("\r\nctype\r\n"), nth: 1} // only the stored answer has this field
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingNthWriteConn{Conn: c, f: blip} }),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "first-store-failed"}
	first := sendOK(t, "first attempt", h.gw.URL, key, chatBody, idem)
	h.settled()
	if n := blip.n.Load(); n != 2 {
		t.Fatalf("%d stores of the answer, want 2: the failed one before its end, the one at the call's end", n)
	}
	again := send(h.gw.URL, key, chatBody, idem)
	if again.status != http.StatusOK || again.header.Get(proxy.ReplayedHeader) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry: %d replayed=%q %s; want the first answer replayed", again.status, again.header.Get(proxy.ReplayedHeader), again.body)
	}
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
}

// TestIdemAnswerRecordedOnItsRowLeavesTheHoldsExpiry: an attempt whose answer Redis refused
// records its call on its row (the last resort that it pinned its key), and leaves its hold's
// expiry as admission set it (hold_ttl): pushed later, a process killed before its settlement
// kept the hold, and every retry of its key at 409 request_in_progress, that much longer
// before the reconciler settled it.
func TestIdemAnswerRecordedOnItsRowLeavesTheHoldsExpiry(t *testing.T) {
	blip, h := newAnswerUnstoredHarness(t)
	u, key := h.user("standard")
	attempt0 := proxy.IdempotentRunID(u.ID, "row-expiry", 0)
	_, release := h.holdAtFirst("settle")
	defer release()
	blip.on.Store(true)
	first := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: "row-expiry"})
	if first.status != http.StatusOK || first.header.Get(proxy.RunIDHeader) != attempt0 {
		t.Fatalf("first attempt: %d run %q %s", first.status, first.header.Get(proxy.RunIDHeader), first.body)
	}
	var calls int
	var lives time.Duration
	if err := h.db.QueryRow(`SELECT ended_calls, TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) FROM run_holds WHERE run_id = ?`,
		attempt0).Scan(&calls, (*microseconds)(&lives)); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("the attempt's row records %d calls, want its answered call", calls)
	}
	if ttl := config.Default().Holds.HoldTTL; lives > ttl+time.Second {
		t.Fatalf("the attempt's hold expires %v after its admission, want hold_ttl, %v", lives, ttl)
	}
	release()
	h.settled()
	blip.on.Store(false)
	h.expectCharges(u.ID, []string{attempt0})
}

// microseconds scans a count of microseconds into a time.Duration.
type microseconds time.Duration

func (m *microseconds) Scan(v any) error {
	n, ok := v.(int64)
	if !ok {
		return fmt.Errorf("microseconds: %T", v)
	}
	*m = microseconds(time.Duration(n) * time.Microsecond)
	return nil
}
