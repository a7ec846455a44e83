package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestFullRedisRefusesWritesAndNothingIsChargedTwice: the gateway refuses to start on a Redis
// that evicts keys (cmd/gateway checkRedisKeepsKeys) and asks for noeviction, under which a
// full Redis refuses writes instead of dropping keys. That is only the safer choice if every
// path meets the refused write as it meets Redis down: a plain call is refused before it runs
// (its duplicate check cannot register it), a named run before its call (its budget cannot be
// reserved), and an Idempotency-Key call that ran without its record is not run again on retry
// — its hold row in the database is the record — and is charged once. Nothing reaches the
// upstream for a refused request.
func TestFullRedisRefusesWritesAndNothingIsChargedTwice(t *testing.T) {
	h, full := newHarnessOnFullRedis(t)
	ctx := context.Background()
	u, key := h.user("standard")
	refusedUnforwarded(t, h, key, "with Redis full", nil, 503, "dedup_unavailable")
	refusedUnforwarded(t, h, key, "with Redis full", map[string]string{"X-Run-Id": "agent-1"}, 503, "billing_unavailable")

	idem := map[string]string{"Idempotency-Key": "full-1"}
	first := sendOK(t, "Idempotency-Key call with Redis full", h.gw.URL, key, chatBody, idem)
	runID := first.header.Get(proxy.RunIDHeader)
	// The attempt's settlement commits after its answer, in the background; a retry before it
	// finds the hold running and is told 409 request_in_progress (retry), after it the row the
	// record stands in for.
	h.waitSettled(runID, 10*time.Second, "its answer ended")
	refusedUnforwarded(t, h, key, "with Redis full", idem, 409, "idempotent_response_lost")

	// Room again: the retry is still not run, and the call is charged once.
	iter := full.Scan(ctx, 0, "junk:*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := full.Del(ctx, iter.Val()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	refusedUnforwarded(t, h, key, "with Redis full", idem, 409, "idempotent_response_lost")
	h.settled()
	var charged []string
	for _, r := range h.holdsOf(u.ID) {
		if r.ChargedMicro > 0 {
			charged = append(charged, r.RunID)
		}
		// The named run refused before its call stays open for its other calls (it is
		// settled by its tally, at 0, once it expires): every other hold is settled.
		if r.State != holds.StateSettled && r.ClientRunID.String != "agent-1" {
			t.Errorf("run %s left %s", r.RunID, r.State)
		}
	}
	if len(charged) != 1 || charged[0] != runID {
		t.Fatalf("charged runs %v, want only the Idempotency-Key call's %s", charged, runID)
	}
}

// newHarnessOnFullRedis is a harness whose gateway's Redis is a private one at its maxmemory
// under noeviction: it answers reads and PING, and refuses every write with OOM. full is a
// client of that Redis, for the test to make room again.
func newHarnessOnFullRedis(t *testing.T) (h *harness, full *redis.Client) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.PrivateRedisURL(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, opt.Addr)
	}
	h = newHarnessOn(t, harnessSetup{redisDialer: dial, tallyDialer: dial, contextTimeouts: true}, nil)
	full = redis.NewClient(opt)
	t.Cleanup(func() { full.Close() })
	junk := strings.Repeat("x", 10_000)
	for i := 0; ; i++ {
		err := full.Set(context.Background(), "junk:"+testenv.RandomID(8), junk, 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM ") {
			return h, full
		}
		if err != nil || i > 10_000 {
			t.Fatalf("filling Redis: %v after %d keys", err, i)
		}
	}
}

// TestReadyzSaysWhenRedisRefusesWrites: a Redis at its maxmemory under noeviction answers
// PING, so /readyz said ready, while every call was refused for the writes it could not make
// (503 dedup_unavailable, billing_unavailable): the load balancer kept sending calls to a
// gateway that could serve none. Readiness writes to Redis now, and names it.
func TestReadyzSaysWhenRedisRefusesWrites(t *testing.T) {
	h, _ := newHarnessOnFullRedis(t)
	resp, err := http.Get(h.gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"redis":"unavailable"`) ||
		!strings.Contains(string(body), `"mysql":"ok"`) {
		t.Fatalf("/readyz with Redis full: %d %s, want 503 naming Redis alone", resp.StatusCode, body)
	}
}

// refusedUnforwarded sends chatBody with hdr and wants it refused status code without the
// upstream being called; when says what Redis was doing.
func refusedUnforwarded(t *testing.T, h *harness, key, when string, hdr map[string]string, status int, code string) {
	t.Helper()
	calls := h.fake.Calls()
	a := send(h.gw.URL, key, chatBody, hdr)
	if a.status != status || errorCode(t, a.body) != code {
		t.Fatalf("%v %s: %d %s, want %d %s", hdr, when, a.status, a.body, status, code)
	}
	if h.fake.Calls() != calls {
		t.Fatalf("%v: refused %s, but the upstream was called", hdr, code)
	}
}
