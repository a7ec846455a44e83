package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// serveBounded serves an answering handler on 127.0.0.1 through newHTTPServer and returns its
// address.
func serveBounded(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), zap.NewNop())
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// TestListenerRefusesHeadersPastTheBound: a request's headers are at most 64 KiB (as the README
// says): past that it is answered 431 before any handler runs, whether in one header or in
// thousands of small ones.
func TestListenerRefusesHeadersPastTheBound(t *testing.T) {
	addr := serveBounded(t)
	for _, tc := range []struct {
		name    string
		headers string
		want    int
	}{
		{"one header under the bound", "X-A: " + strings.Repeat("a", 60<<10) + "\r\n", http.StatusOK},
		{"one header past the bound", "X-A: " + strings.Repeat("a", 72<<10) + "\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"many small headers past the bound", strings.Repeat("X-A: b\r\n", 10_000), http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n"+tc.headers+"\r\n")
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestListenerClosesAConnectionWhoseHeadersStall: a client that sends part of its headers and
// then nothing more (slowloris) has its connection closed once readHeaderTimeout has passed,
// with no handler run: it held a connection and a goroutine for as long as it liked.
func TestListenerClosesAConnectionWhoseHeadersStall(t *testing.T) {
	addr := serveBounded(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: b\r\n"); err != nil {
		t.Fatal(err)
	}
	// Far past the bound: the server closes first, or this read fails with a timeout.
	_ = c.SetReadDeadline(time.Now().Add(3 * readHeaderTimeout))
	_, err = io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection was still open %v after its headers stalled", 3*readHeaderTimeout)
	}
}

// rawRequest writes request to addr as it is, bytes Go's client would never send, and returns
// the answer and its body.
func rawRequest(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}
