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
