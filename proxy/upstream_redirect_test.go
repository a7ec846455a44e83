package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestUpstreamRedirectIsAFailureChargedNothing: the gateway follows no redirect (its upstream
// request carries the operator's key), so a 3xx is the upstream's answer and not an answer to
// the call: a base URL moved, or plain http sent to https. It is answered 502 upstream_error and
// settled at 0, its Location not passed on (a caller's SDK would follow it, out of the gateway);
// read as an answer, its empty body was taken for a broken one: 502 upstream_broken, charged
// the prompt's estimate for a request the provider never took.
func TestUpstreamRedirectIsAFailureChargedNothing(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://elsewhere.invalid/v1/chat/completions")
		w.WriteHeader(http.StatusTemporaryRedirect)
	}, nil)
	for _, body := range []string{chatBody, streamBody} {
		u, key := h.user("standard")
		resp := h.post(key, "/v1/chat/completions", body, nil)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, out) != "upstream_error" {
			t.Fatalf("%s: %d %s, want 502 upstream_error", body, resp.StatusCode, out)
		}
		if loc := resp.Header.Get("Location"); loc != "" {
			t.Fatalf("%s: the upstream's redirect was passed on: Location %q", body, loc)
		}
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
			t.Fatalf("%s: run settled %q charged %d, want upstream_error at 0", body, run.SettleSource.String, run.ChargedMicro)
		}
	}
}
