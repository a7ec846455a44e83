package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestFallbackCallWithoutAnAnswerIsChargedAtTheDearestModel: a router answers a call naming
// fallbacks (`models`) with whichever of them is up, the one asked for having failed when a
// fallback answers. A call that times out (or breaks) before the answer names its model was
// charged its prompt's estimate at the price asked for, while the router may have billed a
// fallback eight times dearer for it. With no word of which model answered, the estimate is
// charged at the dearest model that may have (the price its output bound was reckoned at), as
// a prompt marked for the cache with no word of what the provider did is charged at the
// cache-write price; without fallbacks, at the price asked for.
func TestFallbackCallWithoutAnAnswerIsChargedAtTheDearestModel(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Limits.UpstreamTimeout, c.Limits.HeaderTimeout = 200*time.Millisecond, 100*time.Millisecond
		dear := c.Models["fake-gpt"]
		dear.Input = config.USDPerM{Micro: 8 * dear.Input.Micro}
		c.Models["dear-gpt"] = dear
	})
	u, key := h.user("standard")
	for _, tc := range []struct {
		models string
		times  int64 // the price of the estimate, in fake-gpt's input price
	}{{`["fake-gpt","dear-gpt"]`, 8}, {`["fake-gpt"]`, 1}} {
		body := `{"model":"fake-gpt","models":` + tc.models + `,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 4000) + `"}]}`
		resp := h.post(key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderLatency: "2s"})
		out := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, out) != "upstream_timeout" {
			t.Fatalf("status %d body %s, want 504 upstream_timeout", resp.StatusCode, out)
		}
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if want := (run.InTok*tc.times*h.cfg.Models["fake-gpt"].Input.Micro + 999_999) / 1_000_000; run.InTok == 0 || run.OutTok != 0 || run.CostMicro != want {
			t.Errorf("models %s: run %+v, want the prompt's estimate charged %d µUSD (%d× fake-gpt's input price)", tc.models, run, want, tc.times)
		}
	}
}
