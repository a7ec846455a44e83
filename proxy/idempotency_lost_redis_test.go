package proxy_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestIdemRecordWritesLostOnTheWire: each write of an Idempotency-Key's record in Redis loses
// its reply (Redis ran it) or is lost before it reaches Redis, once or on every try. Whatever
// is lost, the key keeps its promise: one charge per key. An attempt answered 200 is replayed
// to the retry (a pin lost once is written again when the call ends), and an attempt that
// did not pin (an upstream error) lets the retry run as the next attempt, charged once — the
// move past it, if lost, is made by the retry from the attempt's settled row.
func TestIdemRecordWritesLostOnTheWire(t *testing.T) {
	// Markers: the record's start is the call's first HSETNX (the pin repeats it later); the
	// pin alone writes the "ctype" field; the move past an attempt is a script sent by its SHA.
	const start, pin = "hsetnx", "\r\nctype\r\n"
	advance := proxy.AdvanceIdemScriptSHA
	all := 4 // MaxRetries+1 of the harness's client, checked below
	for _, c := range []struct {
		name   string
		marker string
		loss   testenv.RedisLoss
		times  int
		failed bool // the first attempt is an upstream error: it does not pin the key
	}{
		{"start reply lost", start, testenv.RedisReplyLost, 1, false},
		{"start request lost", start, testenv.RedisRequestLost, 1, false},
		{"pin reply lost", pin, testenv.RedisReplyLost, 1, false},
		{"pin request lost", pin, testenv.RedisRequestLost, 1, false},
		{"advance reply lost once", advance, testenv.RedisReplyLost, 1, true},
		{"advance reply lost every try", advance, testenv.RedisReplyLost, all, true},
		{"advance request lost every try", advance, testenv.RedisRequestLost, all, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
			if n := h.rdb.Options().MaxRetries + 1; n != all {
				t.Fatalf("client tries a command %d times, the table assumes %d", n, all)
			}
			u, key := h.user("standard")
			idem := map[string]string{proxy.IdempotencyKeyHeader: "lost-" + testenv.RandomID(4)}
			firstHdr := idem
			if c.failed {
				firstHdr = with(idem, fakellm.HeaderStatus, "500")
			}
			lossy.Arm(c.marker, c.loss, c.times)
			first := send(h.gw.URL, key, chatBody, firstHdr)
			h.settled()
			lossy.Disarm()
			if got := lossy.Fired(); got != c.times {
				t.Fatalf("%d writes lost, want %d", got, c.times)
			}
			retry := send(h.gw.URL, key, chatBody, idem)
			h.settled()
			if c.failed {
				if first.status != http.StatusBadGateway || retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "" {
					t.Fatalf("failed attempt %d, its retry %d %v %s: want the retry run as the next attempt", first.status, retry.status, retry.header, retry.body)
				}
				if all := h.expectCharges(u.ID, []string{retry.header.Get(proxy.RunIDHeader)}, holds.SourceUpstreamError); len(all) != 2 {
					t.Fatalf("%d holds, want the failed attempt and the retry's", len(all))
				}
				return
			}
			if first.status != http.StatusOK || retry.status != http.StatusOK || retry.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(first.body, retry.body) {
				t.Fatalf("first %d, retry %d %v %s: want the first answer replayed", first.status, retry.status, retry.header, retry.body)
			}
			if n := h.fake.Calls(); n != 1 {
				t.Fatalf("%d upstream calls, want 1", n)
			}
			h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
		})
	}
}
