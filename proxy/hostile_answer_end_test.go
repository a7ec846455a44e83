package proxy_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestAnswerEndToAStalledReaderIsBounded: what net/http writes after a handler returns — the
// end of a chunked answer, what is left in its buffer — goes to a client that may have stopped
// reading just as its socket buffer filled. Without a write deadline that write blocks for as
// long as the client likes, and with it the connection and its goroutine. Here the server's
// connection takes every write but the end of the answer, which it holds until the
// connection's write deadline passes, as a full socket buffer would.
func TestAnswerEndToAStalledReaderIsBounded(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	_, key := h.user("standard")
	ln := &endStallListener{Listener: newLoopbackListener(t), stalled: make(chan error, 1), release: make(chan struct{})}
	gw := httptest.NewUnstartedServer(h.srv.Handler())
	gw.Listener.Close()
	gw.Listener = ln
	gw.Start()
	t.Cleanup(gw.Close)
	t.Cleanup(func() { close(ln.release) }) // before gw.Close, which waits for the stalled write

	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	select {
	case err := <-ln.stalled:
		if err == nil {
			t.Fatal("the stalled write ended without an error")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the end of the answer to a stalled reader was still being written 15 s later: it has no write deadline")
	}
}

func newLoopbackListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// endStallListener's connections hold the write that ends a chunked answer (or, with stalls
// set, the first write it matches) until the write deadline set on the connection passes (or
// the test ends), and report how that write ended. began, if set, is closed as the first such
// write starts to wait.
type endStallListener struct {
	net.Listener
	stalled chan error
	release chan struct{}
	stalls  func(p []byte) bool
	began   chan struct{}
	once    sync.Once
}

func (l *endStallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &endStallConn{Conn: c, l: l, moved: make(chan struct{}, 1)}, nil
}

type endStallConn struct {
	net.Conn
	l        *endStallListener
	mu       sync.Mutex
	deadline time.Time
	moved    chan struct{} // the deadline changed
}

func (c *endStallConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	select {
	case c.moved <- struct{}{}:
	default:
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *endStallConn) SetDeadline(t time.Time) error {
	_ = c.SetWriteDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *endStallConn) Write(p []byte) (int, error) {
	stalls := c.l.stalls
	if stalls == nil {
		stalls = func(p []byte) bool { return bytes.HasSuffix(p, []byte("0\r\n\r\n")) }
	}
	if !stalls(p) {
		return c.Conn.Write(p)
	}
	if c.l.began != nil {
		c.l.once.Do(func() { close(c.l.began) })
	}
	for {
		c.mu.Lock()
		d := c.deadline
		c.mu.Unlock()
		var expired <-chan time.Time
		if !d.IsZero() {
			timer := time.NewTimer(time.Until(d))
			defer timer.Stop()
			expired = timer.C
		}
		select {
		case <-expired:
			c.l.stalled <- os.ErrDeadlineExceeded
			return 0, os.ErrDeadlineExceeded
		case <-c.moved:
		case <-c.l.release:
			return 0, net.ErrClosed
		}
	}
}

// TestOtherAnswersToAStalledReaderAreBounded: an answer that is not a model call's goes to
// a client that may have stopped reading (it pipelines requests and reads no answers, or its
// socket buffer is full) as a model call's does, and each of its writes is bounded by
// client_write_timeout, or it holds the connection and its goroutine for good: one written
// whole as its handler returns — a 404 for an unknown route, a 401, a 405, through no
// writeBound — by the deadline set then (boundAnswerEnd); one its handler writes, as /metrics
// and the admin API's reports do, by its writes' own (boundReplies).
func TestOtherAnswersToAStalledReaderAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name, path, stalled string
	}{
		{"an unknown route's 404, written as its handler returns", "/no-such-route", "HTTP/1.1 404"},
		{"the metrics, written by their handler", "/metrics", "HTTP/1.1 200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
			ln := &endStallListener{Listener: newLoopbackListener(t), stalled: make(chan error, 1), release: make(chan struct{}),
				stalls: func(p []byte) bool { return bytes.HasPrefix(p, []byte(tc.stalled)) }}
			gw := httptest.NewUnstartedServer(h.srv.Handler())
			gw.Listener.Close()
			gw.Listener = ln
			gw.Start()
			asked := make(chan struct{})
			t.Cleanup(func() { <-asked }) // last: the caller's request ends once its connection is closed
			t.Cleanup(gw.Close)
			t.Cleanup(func() { close(ln.release) }) // before gw.Close, which waits for the stalled write

			go func() {
				defer close(asked)
				resp, err := http.Get(gw.URL + tc.path)
				if err == nil {
					resp.Body.Close()
				}
			}()
			select {
			case err := <-ln.stalled:
				if err == nil {
					t.Fatal("the stalled write ended without an error")
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("GET %s to a stalled reader was still being written 15 s later: it has no write deadline", tc.path)
			}
		})
	}
}
