package proxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestUndeliveredUpstreamErrorAnswerAgreesWithItsTally: a plain non-streamed call is tallied
// before its answer goes out (with its fingerprint's release), and finish settles it without
// tallying again, so the settlement must charge what that tally says: the tally is what the
// reconciler charges if the process dies before the settlement commits. An upstream that
// answers 200 with an error and no usage used nothing (tallied at 0, source upstream_error);
// a caller whose connection breaks while that answer is written must not turn it into a
// cancelled call charged the prompt's estimate, which the tally does not hold.
func TestUndeliveredUpstreamErrorAnswerAgreesWithItsTally(t *testing.T) {
	pad := strings.Repeat("x", 64<<10) // larger than the server's write buffers
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"error":{"message":"overloaded ` + pad + `","type":"server_error","code":"overloaded"}}`))
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) { c.Upstreams[0].BaseURL = up.URL })
	u, key := h.user("standard")

	// The gateway's connections take the request and fail every write: the caller is gone by
	// the time its answer is written.
	gw := httptest.NewUnstartedServer(h.srv.Handler())
	gw.Listener.Close()
	gw.Listener = &failWritesListener{Listener: newLoopbackListener(t)}
	gw.Start()
	t.Cleanup(gw.Close)
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d through a connection that fails every write", resp.StatusCode)
	}
	h.settled()
	runs := h.holdsOf(u.ID)
	if len(runs) != 1 {
		t.Fatalf("%d holds, want 1", len(runs))
	}
	r := runs[0]
	tallied, found, err := h.tally.Get(context.Background(), r.RunID)
	if err != nil || !found {
		t.Fatalf("no tally for %s (%v)", r.RunID, err)
	}
	if r.State != holds.StateSettled || r.CostMicro != tallied.CostMicro {
		t.Fatalf("settled %s at %d µUSD (source %q); its tally, what the reconciler would charge, says %d",
			r.State, r.CostMicro, r.SettleSource.String, tallied.CostMicro)
	}
	if r.ChargedMicro != 0 || r.SettleSource.String != holds.SourceUpstreamError {
		t.Fatalf("an upstream error with no usage charged %d µUSD, source %q; want 0, %s",
			r.ChargedMicro, r.SettleSource.String, holds.SourceUpstreamError)
	}
}

type failWritesListener struct{ net.Listener }

func (l *failWritesListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return failWritesConn{c}, nil
}

type failWritesConn struct{ net.Conn }

func (c failWritesConn) Write([]byte) (int, error) { return 0, errors.New("caller gone") }
