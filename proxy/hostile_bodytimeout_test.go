package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// A non-streamed answer whose headers came in time but whose body did not finish within
// upstream_timeout: README says 504 upstream_timeout, charged the prompt as upstream_timeout.
func TestHostileNonStreamBodyTimesOut(t *testing.T) {
	// The timeout runs from before the request is written: at 1 s a loaded machine still
	// writing when it ran out saw the call, never sent whole, released at 0 as upstream_error.
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion",`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = timeoutAfterTheRequest })
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	t.Logf("status %d body %s; run src=%s charged=%d", resp.StatusCode, body, run.SettleSource.String, run.ChargedMicro)
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "upstream_timeout" {
		t.Fatalf("status %d body %s, want 504 upstream_timeout", resp.StatusCode, body)
	}
	if run.SettleSource.String != holds.SourceUpstreamTimeout {
		t.Fatalf("settled as %s, want upstream_timeout", run.SettleSource.String)
	}
	// README: the upstream had the whole request, so the call is charged its prompt's estimate.
	if !run.Estimated || run.OutTok != 0 || run.InTok == 0 || run.ChargedMicro != fakeGPTCost(run.InTok, 0) {
		t.Fatalf("run = %+v, want the prompt's estimate charged (%d tokens estimated, %d µUSD)", run, run.InTok, fakeGPTCost(run.InTok, 0))
	}
}
