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
