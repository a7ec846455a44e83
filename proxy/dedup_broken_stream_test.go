package proxy_test

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// endGate holds the first armed Redis write that contains marker until release is closed
// (or, so that a correct gateway is not starved past its own 1 s bound, hold has passed).
type endGate struct {
	marker  []byte
	armed   atomic.Bool
	once    sync.Once
	arrived chan struct{}
	release chan struct{}
	hold    time.Duration
}

func newEndGate(marker string) *endGate {
	return &endGate{marker: []byte(marker), arrived: make(chan struct{}), release: make(chan struct{}), hold: 600 * time.Millisecond}
}

func (g *endGate) client(h *harness) *redis.Client {
	opt := *h.rdb.Options()
	opt.Dialer = wrappedDialer(func(c net.Conn) net.Conn { return &endGateConn{Conn: c, g: g} })
	cl := redis.NewClient(&opt)
	h.t.Cleanup(func() { cl.Close() })
	return cl
}

type endGateConn struct {
	net.Conn
	g *endGate
}

func (c *endGateConn) Write(b []byte) (int, error) {
	g := c.g
	if g.armed.Load() && bytes.Contains(b, g.marker) {
		first := false
		g.once.Do(func() { first = true; close(g.arrived) })
		if first {
			select {
			case <-g.release:
			case <-time.After(g.hold):
			}
		}
	}
	return c.Conn.Write(b)
}

// waitForEnd reads the broken stream until its error event (a line containing end), failing
// the test if the stream ends without it or nothing comes for 10 s.
func waitForEnd(t *testing.T, br *bufio.Reader, end string) {
	t.Helper()
	sawEnd := make(chan bool, 1)
	go func() { sawEnd <- readUntil(br, end) }()
	select {
	case ok := <-sawEnd:
		if !ok {
			t.Fatal("the broken stream ended without its error event")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no end of the broken stream")
	}
}

// readUntil reads SSE lines until one contains s; it reports whether it did.
func readUntil(br *bufio.Reader, s string) bool {
	for {
		line, err := br.ReadString('\n')
		if strings.Contains(line, s) {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// TestSessionRegenerateAfterBrokenStreamRuns: a session's stream breaks (the gateway
// sends its upstream_broken error event: the end of the answer as the caller sees it). The
// caller regenerates (same message) the moment it has that end. README: "a repeat after it
// finished runs"; the session's call must be marked ended before its last byte is sent.
func TestSessionRegenerateAfterBrokenStreamRuns(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	g := newEndGate("sessdone:")
	_, gw2 := h.secondGateway(g.client(h), nil)
	g.armed.Store(true)

	sess := map[string]string{proxy.SessionHeader: "broken-1"}
	first := sendStream(t, gw2, key, streamBody, with(slowStream(10, sess), fakellm.HeaderDropAfter, "3"))
	defer first.Body.Close()
	br := bufio.NewReader(first.Body)
	waitForEnd(t, br, "upstream_broken")
	// The caller has the end of its answer: it regenerates.
	regen := send(h.gw.URL, key, streamBody, sess)
	close(g.release)
	if regen.status != 200 {
		t.Fatalf("regenerate after the broken answer's end: %d %s (X-Should-Retry %q), want 200",
			regen.status, regen.body, regen.header.Get("X-Should-Retry"))
	}
}

// TestPlainResendAfterBrokenStreamRuns: the same for the fingerprint window: a plain stream
// breaks — its connection drops (the gateway's upstream_broken event), or the upstream ends it
// with its own error event — and the script sends the same body again as soon as it has the
// error event.
func TestPlainResendAfterBrokenStreamRuns(t *testing.T) {
	for _, tc := range []struct{ name, knob, end string }{
		{"connection dropped", fakellm.HeaderDropAfter, "upstream_broken"},
		{"upstream error event", fakellm.HeaderErrorAfter, "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			_, key := h.user("standard")
			g := newEndGate("dedup:")
			_, gw2 := h.secondGateway(g.client(h), nil)

			first := sendStream(t, gw2, key, streamBody, with(slowStream(10, nil), tc.knob, "3"))
			defer first.Body.Close()
			br := bufio.NewReader(first.Body)
			if _, err := br.ReadString('\n'); err != nil { // registered: the fingerprint is taken
				t.Fatal(err)
			}
			g.armed.Store(true)
			waitForEnd(t, br, tc.end)
			again := send(h.gw.URL, key, streamBody, nil)
			close(g.release)
			if again.status != 200 {
				t.Fatalf("resend after the broken answer's end: %d %s, want 200", again.status, again.body)
			}
		})
	}
}

// sendStream posts to url and returns the response unread.
func sendStream(t *testing.T, url, key, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	return resp
}
