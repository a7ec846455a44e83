package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestClientThatStopsSendingItsBodyIsCut: a caller that sends its headers and then stalls
// inside its body must not hold a connection, a goroutine and a body buffer for as long as
// it likes (the server sets no read timeout, since nothing bounds how long a body may take
// on a slow link). The gateway gives up on a stalled body the way it gives up on a client
// that stops reading: after client_write_timeout without progress.
func TestClientThatStopsSendingItsBodyIsCut(t *testing.T) {
	h := newHarness(t, func(c *configT) { c.Limits.ClientWriteTimeout = 300 * time.Millisecond })
	_, key := h.user("standard")
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		key, len(body)+100, body) // 100 bytes promised, never sent
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the gateway still waits for the stalled body after 5 s (client_write_timeout 300 ms)")
		}
		return // the connection was closed: cut
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Fatalf("status %d for a stalled body", resp.StatusCode)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds live", live)
	}
}

// TestClientThatStallsPastTheBodyLimitIsCut: a body over max_body_bytes is refused with 413,
// but before that answer goes out the server reads what the body still promises (up to
// 256 KiB) to keep the connection: a caller that stalls there must be cut as a stalled body
// is, not hold the connection and its goroutine for as long as it likes.
func TestClientThatStallsPastTheBodyLimitIsCut(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		c.Limits.ClientWriteTimeout = 300 * time.Millisecond
		c.Limits.MaxBodyBytes = 1024
	})
	_, key := h.user("standard")
	for _, chunked := range []bool{false, true} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"fake-gpt","messages":[{"role":"user","content":"` + strings.Repeat("x", 1500) + `"}]}`
		if chunked {
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n",
				key, len(body), body) // no last chunk: the body never ends
		} else {
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				key, len(body)+100, body) // 100 bytes promised, never sent
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Errorf("chunked=%v: no answer 5 s after a body over the limit stalled (client_write_timeout 300 ms)", chunked)
			}
			conn.Close()
			continue
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked=%v: status %d, want 413", chunked, resp.StatusCode)
		}
	}
}

// TestUnauthenticatedStalledBodyIsCut: a request refused before its body is read (a wrong
// key) leaves the server to drain the body before answering; a caller that stalls there
// holds the connection and its goroutine for good, without even a valid key.
func TestUnauthenticatedStalledBodyIsCut(t *testing.T) {
	h := newHarness(t, func(c *configT) { c.Limits.ClientWriteTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tg_wrong\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mo")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("no answer 5 s after an unauthenticated body stalled")
		}
		return
	}
	resp.Body.Close()
}

// TestClientThatTricklesItsBodyIsCut: a caller that sends its body a byte at a time, each
// well within the stall window, never stalls: without a bound on the body's pace it held a
// connection, a goroutine and a growing buffer for as long as it liked (a 4 MiB body at a
// byte every half window is years). Past its first client_write_timeout a body must arrive at
// 1 KiB/s on average.
func TestClientThatTricklesItsBodyIsCut(t *testing.T) {
	h := newHarness(t, func(c *configT) { c.Limits.ClientWriteTimeout = time.Second })
	_, key := h.user("standard")
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
		key)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond) // a tenth of the stall window
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the gateway still reads a body trickling at 20 bytes/s after 5 s (client_write_timeout 1 s)")
		}
		return // the connection was closed: cut
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d for a trickling body, want 408", resp.StatusCode)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds live", live)
	}
}
