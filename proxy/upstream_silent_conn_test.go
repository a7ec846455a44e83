package proxy_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// silencer dials connections that it can all silence at once, as a network that starts dropping
// every packet of the connections already open (a NAT or load balancer that forgot them, a
// failover) without closing them: nothing sent on them arrives, nothing comes back.
type silencer struct {
	mu    sync.Mutex
	flags []*atomic.Bool
}

func (s *silencer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	stalled := &atomic.Bool{}
	s.mu.Lock()
	s.flags = append(s.flags, stalled)
	s.mu.Unlock()
	return &testenv.StallingConn{Conn: c, Stalled: stalled}, nil
}

// silence silences every connection dialed so far; the ones dialed later work.
func (s *silencer) silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.flags {
		f.Store(true)
	}
}

// TestUpstreamHTTP2ConnectionGoneSilentIsLeft: the gateway speaks HTTP/2 to a TLS upstream that
// offers it (the providers do), every call to it on one connection. When that connection goes
// silent without closing, the calls on it, and every call sent after them (HTTP/2 keeps a
// connection it has no news of), waited for answers that never came until header_timeout or
// upstream_timeout, and were then charged their prompts' estimates (504 upstream_timeout: the
// request was written) though the provider never had them — for as long as TCP took to give up
// on the connection, minutes. The transport checks a connection that has been silent with a
// ping and drops it when the ping goes unanswered: the call on it is answered 502
// upstream_unreachable, charged nothing, and the next call is served on a new connection.
func TestUpstreamHTTP2ConnectionGoneSilentIsLeft(t *testing.T) {
	proxy.SetUpstreamPing(t, 500*time.Millisecond, 500*time.Millisecond)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("the gateway reached the upstream over %s, want HTTP/2", r.Proto)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(hostileChunk + hostileUsage + "data: [DONE]\n\n"))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	link := &silencer{}
	tr := proxy.NewTransport(config.Default().Limits)
	tr.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tr.DialContext = link.dial
	h := newHarnessOn(t, harnessSetup{transport: tr}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "h2", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
		// Far longer than the ping's check: a call left to it was cut here.
		c.Limits.HeaderTimeout = 30 * time.Second
	})
	u, key := h.user("standard")
	call := func() (int, string, int64, string) {
		t.Helper()
		resp := h.post(key, "/v1/chat/completions", streamBody, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		code := ""
		if resp.StatusCode != http.StatusOK {
			code = errorCode(t, answer)
		}
		return resp.StatusCode, code, run.ChargedMicro, run.SettleSource.String
	}
	if status, code, _, _ := call(); status != http.StatusOK {
		t.Fatalf("first call: %d %s, want 200", status, code)
	}
	link.silence()
	status, code, charged, source := call()
	t.Logf("call on the silent connection: %d %s, charged %d (%s)", status, code, charged, source)
	if status != http.StatusBadGateway || code != "upstream_unreachable" || charged != 0 {
		t.Errorf("call on the silent connection: %d %s charged %d (%s), want 502 upstream_unreachable charged nothing",
			status, code, charged, source)
	}
	if status, code, charged, source := call(); status != http.StatusOK {
		t.Errorf("call after the silent connection: %d %s charged %d (%s), want 200 on a new connection", status, code, charged, source)
	}
}
