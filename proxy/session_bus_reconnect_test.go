package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// cuttableRedis is a Redis client's dialer whose connections the test can cut, and whose new
// dials then fail until heal: a process's link to Redis broken (a restart, a proxy's idle
// cut), then back.
type cuttableRedis struct {
	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func (c *cuttableRedis) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return nil, errors.New("redis unreachable (cut by the test)")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cuttableRedis) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

func (c *cuttableRedis) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = false
}

// TestSessionCancelSentWhileTheBusReconnectsStopsTheRun: a session's message streams on a
// gateway whose link to Redis breaks (its cancel bus's subscription with it); the session's
// next message, on another gateway, replaces it meanwhile. The cancel, published while no
// subscription of the serving gateway listened, was lost: once the link was back the old run
// went on to its end and was charged in full beside the new one. The cancel now leaves a mark
// that the bus reads when it subscribes again: the old stream ends superseded, settled by
// cancel at what it used.
func TestSessionCancelSentWhileTheBusReconnectsStopsTheRun(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	cut := &cuttableRedis{}
	second, other, busName := gatewayOnCuttableRedis(t, h, cut)
	session := "chat-" + testenv.RandomID(4)
	resp := longSessionStream(t, other, key, session)
	oldRun := resp.Header.Get(proxy.RunIDHeader)
	rd := afterContent(t, resp, 3) // claimed, forwarding, registered on the second gateway's bus

	cut.cut()
	b := sendOK(t, "new message", h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: session})
	cut.heal()
	// The bus of the second gateway subscribes again on its own (go-redis reconnects).
	oldStopsOnceSubscribed(t, h, second, busName, rd, u.ID, oldRun, b.header.Get(proxy.RunIDHeader))
}

// gatewayOnCuttableRedis starts h's second gateway with its duplicate checks and cancel bus on
// a Redis connection cut can break, named busName (subscribed looks for it).
func gatewayOnCuttableRedis(t *testing.T, h *harness, cut *cuttableRedis) (second *proxy.Server, url, busName string) {
	t.Helper()
	opt := *h.rdb.Options()
	busName = "bus-" + testenv.RandomID(6)
	opt.Dialer, opt.ClientName = cut.dial, busName
	dedup := redis.NewClient(&opt)
	t.Cleanup(func() { dedup.Close() })
	// Its session check (every heartbeat_interval) off for the test's length: the row would stop
	// the replaced run by itself within that, and the bus's own sweep of the cancel marks as it
	// subscribes again would go untested.
	second, url = h.secondGateway(dedup, func(c *config.Config) {
		c.Holds.HeartbeatInterval, c.Holds.LeaseTTL = time.Hour, 2*time.Hour
	})
	t.Cleanup(func() { _ = h.srv.Close() })
	return second, url, busName
}

// longSessionChunks is a longSessionStream's answer: 10 ms each, 15 s, so that only a cancel
// (or a hold's TTL of a few seconds) ends it early.
const longSessionChunks = 1500

// longSessionStream sends a session's message to the gateway at url, streamed for 15 s (1 500
// chunks 10 ms apart): long enough to be replaced while it runs. Its body is closed at cleanup.
func longSessionStream(t *testing.T, url, key, session string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(proxy.SessionHeader, session)
	req.Header.Set(fakellm.HeaderChunks, strconv.Itoa(longSessionChunks))
	req.Header.Set(fakellm.HeaderChunkInterval, "10ms")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// oldStopsOnceSubscribed waits (10 s at most) for the second gateway's bus, its connection
// named busName, to subscribe, then checks that the old run's stream (rd, past its first
// events) ends with the superseded event, settled by cancel at its partial output, and that
// the user is charged the old run and the new one alone.
func oldStopsOnceSubscribed(t *testing.T, h *harness, second *proxy.Server, busName string, rd *bufio.Reader, userID uint64, oldRun, newRun string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !subscribed(t, h.rdb, busName) {
		if time.Now().After(deadline) {
			t.Fatal("the second gateway's cancel bus did not subscribe within 10 s of Redis being back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("old stream was not stopped once its gateway's bus subscribed: ...%s", rest[max(0, len(rest)-300):])
	}
	waitSettlements(t, second)
	run := h.run(userID, oldRun)
	if run.SettleSource.String != holds.SourceCancel || run.OutTok < 3 || run.OutTok >= 1500 {
		t.Fatalf("old run = %+v, want settled by cancel with its partial output", run)
	}
	h.settled()
	h.expectCharges(userID, []string{oldRun, newRun})
}

// subscribed reports whether a connection named name holds a pattern subscription.
func subscribed(t *testing.T, rdb *redis.Client, name string) bool {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") && !strings.Contains(line, " psub=0 ") {
			return true
		}
	}
	return false
}

// TestSessionRunRegisteredWhileTheBusCouldNotSubscribeIsStoppedOnceItDoes: a gateway serves a
// session's first message while its Redis cannot be reached, so its cancel bus cannot
// subscribe (the run is served all the same). Redis is back, and the session's next message,
// on another gateway, replaces that run: the cancel reached no subscription of the serving
// gateway, and the run went on to its end — the bus was tried again only by a later session
// call, and even once it subscribed the cancel was gone. Now the bus tries again on its own
// while runs wait for it and, once subscribed, reads the cancel marks of the runs it serves:
// the old stream ends superseded, settled by cancel at what it used.
func TestSessionRunRegisteredWhileTheBusCouldNotSubscribeIsStoppedOnceItDoes(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	cut := &cuttableRedis{}
	cut.cut() // down from the start: the second gateway's bus never subscribed
	second, other, busName := gatewayOnCuttableRedis(t, h, cut)
	session := "chat-" + testenv.RandomID(4)
	resp := longSessionStream(t, other, key, session)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first message with the bus down: %d", resp.StatusCode)
	}
	oldRun := resp.Header.Get(proxy.RunIDHeader)
	rd := afterContent(t, resp, 3)

	cut.heal()
	b := sendOK(t, "new message", h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: session})
	// No other session call comes to the second gateway: its bus subscribes on its own.
	oldStopsOnceSubscribed(t, h, second, busName, rd, u.ID, oldRun, b.header.Get(proxy.RunIDHeader))
}
