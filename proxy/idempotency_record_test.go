package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemCorruptStoredAnswerIsNotRunAgain: a record that names a run but holds no answer a
// caller could have been sent (a status of 0 or none, the body gone: edited by hand, a
// partial write) is an attempt that ran. Its retry is told 409 idempotent_response_lost —
// neither run and charged again, nor answered by writing status 0, which panics net/http and
// drops the connection with no answer at all.
func TestIdemCorruptStoredAnswerIsNotRunAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(ctx context.Context, h *harness, record string) error
	}{
		{"status 0", func(ctx context.Context, h *harness, rec string) error {
			return h.rdb.HSet(ctx, rec, "status", "0").Err()
		}},
		{"status gone", func(ctx context.Context, h *harness, rec string) error { return h.rdb.HDel(ctx, rec, "status").Err() }},
		{"answer gone", func(ctx context.Context, h *harness, rec string) error { return h.rdb.HDel(ctx, rec, "resp").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			_, key := h.user("standard")
			idem := map[string]string{proxy.IdempotencyKeyHeader: "corrupt-" + strings.ReplaceAll(tc.name, " ", "-")}
			first := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
			h.settled()
			ctx := context.Background()
			recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
			if err != nil || len(recs) != 1 {
				t.Fatalf("replay records %v (%v), want one", recs, err)
			}
			if err := tc.corrupt(ctx, h, recs[0]); err != nil {
				t.Fatal(err)
			}
			calls, holdsBefore := h.fake.Calls(), countHolds(h)

			retry := send(h.gw.URL, key, chatBody, idem)
			h.settled()
			if retry.err != nil {
				t.Fatalf("retry under a key whose stored answer is corrupt: %v; want 409 idempotent_response_lost", retry.err)
			}
			if retry.status != http.StatusConflict || !strings.Contains(string(retry.body), "idempotent_response_lost") {
				t.Fatalf("retry: %d %s; want 409 idempotent_response_lost", retry.status, retry.body)
			}
			if got := errorRunID(t, retry.body); got != first.header.Get(proxy.RunIDHeader) {
				t.Fatalf("409 names run %s, want the attempt that ran, %s", got, first.header.Get(proxy.RunIDHeader))
			}
			if n := h.fake.Calls(); n != calls {
				t.Fatalf("upstream calls %d -> %d: the attempt already ran", calls, n)
			}
			if n := countHolds(h); n != holdsBefore {
				t.Fatalf("holds %d -> %d: the retry was admitted", holdsBefore, n)
			}
		})
	}
}

// TestIdemRecordExpiringBeforeItsAnswerIsReadRunsTheRequest: the stored answer is read apart
// from the record that said there is one. A record whose replay_ttl ends between the two
// reads leaves the key free (README: replayed for replay_ttl): the request runs as a new one.
// It was answered 200 `Idempotent-Replayed: true` with an empty body.
func TestIdemRecordExpiringBeforeItsAnswerIsReadRunsTheRequest(t *testing.T) {
	r := retryHeldAtReplay(t, "expires-between-reads")
	h, u, first, done, hold := r.h, r.user, r.first, r.done, r.hold
	// The record expires while the read of its answer is on its way.
	waitRecordExpired(t, h, first.header.Get(proxy.RunIDHeader))
	hold.Let()
	retry := <-done
	h.settled()
	if retry.err != nil || retry.status != http.StatusOK {
		t.Fatalf("request under a key that expired before its answer was read: %d %v %s; want it run", retry.status, retry.err, retry.body)
	}
	if r := retry.header.Get(proxy.ReplayedHeader); r != "" || len(retry.body) == 0 {
		t.Fatalf("answered %s=%q with a %d-byte body; want the request run, not replayed", proxy.ReplayedHeader, r, len(retry.body))
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader), retry.header.Get(proxy.RunIDHeader)})
}

// TestIdemAnswerOfAnotherBodyStoredBetweenReadsIsNotReplayed: a record that expires between
// the read that found it pinned and the read of its answer leaves the key free, and a request
// with another body under the key may run and pin it in between. The answer then read is
// that request's, for another body: replayed, it answered this body's caller with another
// request's answer. It is a reused key (422), as it would be had it come after.
func TestIdemAnswerOfAnotherBodyStoredBetweenReadsIsNotReplayed(t *testing.T) {
	r := retryHeldAtReplay(t, "reused-between-reads")
	h, u, key, idem, first, done, hold := r.h, r.user, r.key, r.idem, r.first, r.done, r.hold
	waitRecordExpired(t, h, first.header.Get(proxy.RunIDHeader))
	otherBody := strings.Replace(chatBody, "hello", "goodbye", 1)
	other := send(h.gw.URL, key, otherBody, idem) // not settled() yet: that waits for the held retry too
	if other.status != http.StatusOK || other.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("another body under the freed key: %d %s; want it run", other.status, other.body)
	}
	hold.Let()
	retry := <-done
	h.settled()
	if retry.err != nil || retry.status != http.StatusUnprocessableEntity || !strings.Contains(string(retry.body), "idempotency_key_reused") {
		t.Fatalf("the first body's retry, the key now pinned by another body: %d %v %s (%s=%q); want 422 idempotency_key_reused",
			retry.status, retry.err, retry.body, proxy.ReplayedHeader, retry.header.Get(proxy.ReplayedHeader))
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader), other.header.Get(proxy.RunIDHeader)})
}

// heldReplay is a retry under an Idempotency-Key whose first attempt has settled, held at
// the read of its stored answer (retryHeldAtReplay).
type heldReplay struct {
	h     *harness
	hold  *testenv.HeldWrite
	user  holds.User
	key   string
	idem  map[string]string
	first answer      // the first attempt's answer
	done  chan answer // the retry's answer, once hold is let go
}

// retryHeldAtReplay runs a first attempt under idemKey (replay_ttl 1 s) and sends its retry,
// returning once the retry's read of the stored answer is held on its way to Redis.
func retryHeldAtReplay(t *testing.T, idemKey string) heldReplay {
	t.Helper()
	r := heldReplay{hold: testenv.NewHeldWrite(replayReadMarker), done: make(chan answer, 1),
		idem: map[string]string{proxy.IdempotencyKeyHeader: idemKey}}
	r.h = newHarnessOn(t, harnessSetup{redisDialer: holdingDialer(r.hold), contextTimeouts: true},
		func(c *config.Config) { c.Dedup.ReplayTTL = time.Second })
	r.user, r.key = r.h.user("standard")
	r.first = sendOK(t, "first", r.h.gw.URL, r.key, chatBody, r.idem)
	r.h.settled()
	go func() { r.done <- send(r.h.gw.URL, r.key, chatBody, r.idem) }()
	select {
	case <-r.hold.Held():
	case a := <-r.done:
		t.Fatalf("retry answered %d %s without reading the stored answer", a.status, a.body)
	case <-time.After(10 * time.Second):
		t.Fatal("the retry never read the stored answer")
	}
	return r
}

// replayReadMarker is in the replay's read of a stored answer, and in no other command: it
// asks for these fields in this order.
const replayReadMarker = "$5\r\nctype\r\n$4\r\nresp\r\n$4\r\nhdrs\r\n"

// holdingDialer connects the gateway's Redis client through connections that hold hold's
// marked write.
func holdingDialer(hold *testenv.HeldWrite) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &testenv.HoldingConn{Conn: c, Hold: hold}, nil
	}
}

// waitRecordExpired waits until the key's one replay record has expired in Redis and its
// attempt, firstRun, settled replay_ttl (1 s) ago by the database clock: a record Redis no
// longer has is taken for expired only once the attempt began replay_ttl ago (README:
// idempotent_response_lost), which its settlement a moment later implies, so that is waited
// for too, not left to how late a poll saw the expiry.
func waitRecordExpired(t *testing.T, h *harness, firstRun string) {
	t.Helper()
	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("replay records %v (%v), want one", recs, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := h.rdb.Exists(ctx, recs[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record did not expire within 5 s of a 1 s replay_ttl")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		var settledLongAgo bool
		if err := h.db.GetContext(ctx, &settledLongAgo, `SELECT settled_at <= NOW(6) - INTERVAL 1 SECOND FROM run_holds WHERE run_id = ?`,
			firstRun); err != nil {
			t.Fatal(err)
		}
		if settledLongAgo {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first attempt did not settle a replay_ttl ago within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countHolds(h *harness) int {
	all, _ := h.holdCount()
	return all
}
