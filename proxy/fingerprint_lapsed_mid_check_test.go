package proxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// lapseBeforeGet is a connection to Redis that, while armed (a count of GETs), makes key
// taken again through plain before a SET NX of it, and deletes it just before a GET of it: the
// fingerprint lapses between each round's SET NX, which found it taken, and its GET of the run
// it names.
type lapseBeforeGet struct {
	net.Conn
	key   *atomic.Pointer[string]
	plain *atomic.Pointer[redis.Client]
	armed *atomic.Int32
}

const endedRunID = "r_0123456789abcdef0123456789abcdef"

func (c *lapseBeforeGet) Write(b []byte) (int, error) {
	k := c.key.Load()
	if k == nil || c.armed.Load() <= 0 || !bytes.Contains(b, []byte(*k)) {
		return c.Conn.Write(b)
	}
	ctx := context.Background()
	switch upper := bytes.ToUpper(b); {
	case bytes.Contains(upper, []byte("\r\nSET\r\n")):
		if err := c.plain.Load().Set(ctx, *k, endedRunID, time.Minute).Err(); err != nil {
			return 0, err
		}
	case bytes.Contains(upper, []byte("\r\nGET\r\n")):
		c.armed.Add(-1)
		if err := c.plain.Load().Del(ctx, *k).Err(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

// TestFingerprintLapsingMidCheckIsClaimedBeforeTheCallRuns: the fingerprint a plain call finds
// taken lapses before the check reads whom it names (its window ends between the two
// commands). The check must go round and claim it, not let the call run without one: else the
// same body sent while the call runs is not refused as its duplicate, but run and charged
// beside it. Should it lapse so at every round the check allows (taken again each time by
// other resends), the call is refused 503 dedup_unavailable and not run: it has no claim.
func TestFingerprintLapsingMidCheckIsClaimedBeforeTheCallRuns(t *testing.T) {
	t.Run("once", func(t *testing.T) { fingerprintLapsingMidCheck(t, 1) })
	// proxy's maxFingerprintRounds.
	t.Run("every round", func(t *testing.T) { fingerprintLapsingMidCheck(t, 4) })
}

func fingerprintLapsingMidCheck(t *testing.T, lapses int32) {
	var (
		key   atomic.Pointer[string]
		plain atomic.Pointer[redis.Client]
		armed atomic.Int32
	)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lapseBeforeGet{Conn: conn, key: &key, plain: &plain, armed: &armed}, nil
	}
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	h := newHarnessOn(t, harnessSetup{redisDialer: dial}, func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL = gateSrv.URL
		}
		c.Dedup.Window = time.Minute
	})
	opt := *h.rdb.Options()
	opt.Dialer = nil
	plainRDB := redis.NewClient(&opt)
	t.Cleanup(func() { plainRDB.Close() })
	plain.Store(plainRDB)
	u, userKey := h.user("standard")
	sum := sha256.Sum256([]byte("/v1/chat/completions\x00" + chatBody))
	fp := h.keys.Dedup(u.ID, hex.EncodeToString(sum[:]))
	key.Store(&fp)
	armed.Store(lapses)
	if lapses > 1 {
		a := send(h.gw.URL, userKey, chatBody, nil)
		if armed.Load() != 0 {
			t.Fatalf("%d of %d lapses left unused: the check gave up early or went on", armed.Load(), lapses)
		}
		h.settled()
		if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "dedup_unavailable" {
			t.Errorf("call whose fingerprint lapsed at every round: %d %s, want 503 dedup_unavailable", a.status, a.body)
		}
		if n := gate.fake.Calls(); n != 0 {
			t.Errorf("%d upstream calls, want none", n)
		}
		return
	}

	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, userKey, chatBody, map[string]string{"X-Test-Gate": "first"}) }()
	defer gate.open("first")
	gate.await(t, "first", 1)
	if armed.Load() != 0 {
		t.Fatal("the fingerprint was not lapsed between the check's SET NX and its GET")
	}
	owner, err := plainRDB.Get(context.Background(), fp).Result()
	if err != nil {
		t.Fatalf("fingerprint while the call runs: %v, want it claimed by the call", err)
	}
	dup := send(h.gw.URL, userKey, chatBody, nil)
	if dup.status != http.StatusConflict || errorCode(t, dup.body) != "duplicate" || errorRunID(t, dup.body) != owner {
		t.Errorf("the same body while the call runs: %d %s, want 409 duplicate of %s", dup.status, dup.body, owner)
	}
	gate.open("first")
	a := <-first
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("call: %d %v %s", a.status, a.err, a.body)
	}
	if run := a.header.Get(proxy.RunIDHeader); run != owner {
		t.Errorf("fingerprint named %s while the call %s ran, want the call", owner, run)
	}
	h.settled()
	if n := gate.fake.Calls(); n != 1 {
		t.Errorf("%d upstream calls, want 1", n)
	}
}
