package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
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
			first := send(h.gw.URL, key, chatBody, idem)
			if first.err != nil || first.status != http.StatusOK {
				t.Fatalf("first: %d %v %s", first.status, first.err, first.body)
			}
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
	// The replay's read of the stored answer, and no other command, asks for these fields in
	// this order.
	hold := testenv.NewHeldWrite("$5\r\nctype\r\n$4\r\nresp\r\n$4\r\nhdrs\r\n")
	h := newHarnessOn(t, harnessSetup{
		redisDialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &testenv.HoldingConn{Conn: c, Hold: hold}, nil
		},
		contextTimeouts: true,
	}, func(c *config.Config) { c.Dedup.ReplayTTL = time.Second })
	u, key := h.user("standard")
	idem := map[string]string{proxy.IdempotencyKeyHeader: "expires-between-reads"}
	first := send(h.gw.URL, key, chatBody, idem)
	if first.status != http.StatusOK {
		t.Fatalf("first: %d %v %s", first.status, first.err, first.body)
	}
	h.settled()

	done := make(chan answer, 1)
	go func() { done <- send(h.gw.URL, key, chatBody, idem) }()
	select {
	case <-hold.Held():
	case a := <-done:
		t.Fatalf("retry answered %d %s without reading the stored answer", a.status, a.body)
	case <-time.After(10 * time.Second):
		t.Fatal("the retry never read the stored answer")
	}
	// The record expires while the read of its answer is on its way.
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
	// The record's replay_ttl runs from its pin, just before the attempt settled; a record
	// Redis no longer has is taken for expired once the attempt settled replay_ttl ago by the
	// database clock (README: idempotent_response_lost), so that is waited for too, not left
	// to how late the poll above saw the expiry.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var settledLongAgo bool
		if err := h.db.GetContext(ctx, &settledLongAgo, `SELECT settled_at <= NOW(6) - INTERVAL 1 SECOND FROM run_holds WHERE run_id = ?`,
			first.header.Get(proxy.RunIDHeader)); err != nil {
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

func countHolds(h *harness) int {
	all, _ := h.holdCount()
	return all
}
