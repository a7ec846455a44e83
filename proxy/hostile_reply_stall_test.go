package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestLargeReplyToAStalledReaderIsBounded: the routes that are not model calls (the admin
// API's usage report of up to 30 MB, its listings, /metrics) wrote their answers with no write
// deadline: a client that stops reading once its socket buffer is full held the handler, its
// goroutine and everything it was writing for as long as it kept the connection open. Every
// write of theirs now has client_write_timeout, as a model call's do. A reader that keeps
// reading is not cut however long the answer takes (each write gets its own deadline).
func TestLargeReplyToAStalledReaderIsBounded(t *testing.T) {
	const size = 64 << 20 // far past any socket buffer
	wrote := make(chan error, 1)
	big := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		row := bytes.Repeat([]byte("x"), 1<<20)
		var err error
		for i := 0; i < size/len(row) && err == nil; i++ {
			_, err = w.Write(row)
		}
		wrote <- err
	})
	// The write timeout leaves the slow reader below a wide margin on a loaded machine (each
	// 1 MiB write waits ~0.1 s for it), while its whole answer outlasts six of them.
	h := newHarnessOn(t, harnessSetup{admin: big}, func(c *config.Config) { c.Limits.ClientWriteTimeout = time.Second })
	conn, err := net.Dial("tcp", h.gw.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET /admin/report HTTP/1.1\r\nHost: gw\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing.
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("64 MiB written to a client that read nothing")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the reply to a client that stopped reading was still being written 20 s later: its writes have no deadline")
	}

	// A slow reader that keeps reading gets the whole answer, past many deadlines.
	slow := make(chan int64, 1)
	go func() {
		resp, err := http.Get(h.gw.URL + "/admin/report")
		if err != nil {
			slow <- -1
			return
		}
		defer resp.Body.Close()
		// 1 MiB every 100 ms: 6.4 s for the answer, six times the write timeout.
		var n int64
		buf := make([]byte, 1<<20)
		for {
			m, err := io.ReadFull(resp.Body, buf)
			n += int64(m)
			if err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		slow <- n
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("a reader that kept reading was cut: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the reply to a slow reader did not end")
	}
	if n := <-slow; n != size {
		t.Fatalf("slow reader got %d bytes, want %d", n, size)
	}
}
