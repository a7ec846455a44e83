package proxy_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestSupersededBeforeItsRequestReachedTheUpstreamNamesNoRun: a call whose session is taken over
// by a newer message while its request is still being written to the provider (the provider
// never had it whole) is released at 0, as refused before forwarding: the README's refused
// requests (its 409s among them) carry no X-Tollgate-Run-Id. It was answered 409 superseded
// naming the released run, which 2fa0487 stopped for a call superseded a moment earlier.
func TestSupersededBeforeItsRequestReachedTheUpstreamNamesNoRun(t *testing.T) {
	addr, accepted := holeUpstream(t)
	// Past the gateway's send buffer (at most tcp_wmem's 4 MiB by default) and the upstream's window.
	const bodyBytes = 12 << 20
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = append([]config.Upstream{{Name: "hole", Kind: "openai", BaseURL: "http://" + addr, Models: []string{"hole-model"}}},
			c.Upstreams...)
		c.Models["hole-model"] = config.ModelCfg{Output: config.USDPerM{Micro: 1}}
		c.Limits.MaxBodyBytes = 2 * bodyBytes
		c.Limits.MaxEventBytes = int(4 * bodyBytes)
	})
	u, key := h.user("standard")
	big := `{"model":"hole-model","max_tokens":16,"metadata":{"pad":"` + strings.Repeat("x", bodyBytes) + `"},"messages":[{"role":"user","content":"old"}]}`
	first := make(chan answer, 1)
	go func() {
		first <- sendTo(h.gw.URL, "/v1/chat/completions", key, big, map[string]string{proxy.SessionHeader: "s-hole"})
	}()
	// The gateway is writing the request; the upstream reads none of it.
	conn := <-accepted
	defer conn.Close()
	sendOK(t, "newer message", h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"newer"}]}`,
		map[string]string{proxy.SessionHeader: "s-hole"})
	a := <-first
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.status != http.StatusConflict || !strings.Contains(string(a.body), "superseded") {
		t.Fatalf("old message: %d %s, want 409 superseded", a.status, a.body)
	}
	h.settled()
	if _, live := h.holdCount(); live != 0 {
		t.Fatalf("%d holds left open", live)
	}
	if id := a.header.Get(proxy.RunIDHeader); id != "" {
		r := h.run(u.ID, id)
		t.Fatalf("a call refused before its request reached the upstream named run %s (settled %s at %d µUSD)", id, r.SettleSource.String, r.ChargedMicro)
	}
}

// holeUpstream is an upstream that accepts connections and reads nothing, with a small
// receive window: a request larger than the socket buffers is never written whole. It returns
// its address and the connections it accepted.
func holeUpstream(t *testing.T) (addr string, accepted <-chan net.Conn) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	})
	return ln.Addr().String(), conns
}
