package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestUpstreamTimeoutBeforeTheRequestWasSentIsChargedNothing: a call whose request the
// provider never had whole when upstream_timeout ran out (it read none of it) is answered 504
// and settled at 0, as an upstream that failed before producing anything: charging its prompt's
// estimate, as for a provider that took the prompt and was still working on it, billed the
// caller for a prompt that never reached it.
func TestUpstreamTimeoutBeforeTheRequestWasSentIsChargedNothing(t *testing.T) {
	addr, _ := holeUpstream(t)
	const bodyBytes = 12 << 20 // past the gateway's send buffer and the upstream's window
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = append([]config.Upstream{{Name: "hole", Kind: "openai", BaseURL: "http://" + addr, Models: []string{"hole-model"}}},
			c.Upstreams...)
		c.Models["hole-model"] = config.ModelCfg{Input: config.USDPerM{Micro: 1}, Output: config.USDPerM{Micro: 1}}
		c.Limits.MaxBodyBytes = 2 * bodyBytes
		c.Limits.MaxEventBytes = int(4 * bodyBytes)
		c.Limits.UpstreamTimeout = 2 * time.Second
	})
	u, key := h.user("standard")
	big := `{"model":"hole-model","max_tokens":16,"metadata":{"pad":"` + strings.Repeat("x", bodyBytes) + `"},"messages":[{"role":"user","content":"hello"}]}`
	resp := h.post(key, "/v1/chat/completions", big, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "upstream_timeout" {
		t.Fatalf("%d %s, want 504 upstream_timeout", resp.StatusCode, body)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 {
		t.Fatalf("run settled %q charged %d µUSD (in_tok %d), want upstream_error at 0: the provider never had the request",
			run.SettleSource.String, run.ChargedMicro, run.InTok)
	}
}
