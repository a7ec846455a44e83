package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
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
	h, gate := gatedHarness(t, func(c *config.Config) {
		c.Limits.UpstreamTimeout, c.Limits.HeaderTimeout = timeoutAfterTheRequest, 100*time.Millisecond
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
		// The upstream takes the request and stays silent until the gateway gives up on it.
		resp := h.post(key, "/v1/chat/completions", body, map[string]string{"X-Test-Gate": "silent"})
		out := readAll(t, resp.Body)
		resp.Body.Close()
		gate.await(t, "silent", 1) // the upstream had the whole request
		if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, out) != "upstream_timeout" {
			t.Fatalf("status %d body %s, want 504 upstream_timeout", resp.StatusCode, out)
		}
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if want := (run.InTok*tc.times*h.cfg.Models["fake-gpt"].Input.Micro + 999_999) / 1_000_000; run.InTok == 0 || run.OutTok != 0 || run.CostMicro != want {
			t.Errorf("models %s: run %+v, want the prompt's estimate charged %d µUSD (%d× fake-gpt's input price)", tc.models, run, want, tc.times)
		}
	}
}

// TestUnpricedAnswerIsLoggedAndOnAFallbackCallChargedAtTheDearest: an answer may name a model
// the gateway has no price for (a router's own pick past the call's list). It was billed at the
// price asked for without a word, so that nothing showed an operator a model to price. It is
// logged, and on a call naming fallbacks, where the answer came from none the call named,
// billed at the dearest model the call may have been answered with, as an answer naming no
// model is; on a call without fallbacks, at the price asked for (README).
func TestUnpricedAnswerIsLoggedAndOnAFallbackCallChargedAtTheDearest(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","model":"mystery-1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":1000,"total_tokens":2000}}`)
	}))
	t.Cleanup(up.Close)
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, routerWithDearModel(up.URL))
	u, key := h.user("standard")
	m := h.cfg.Models["fake-gpt"]
	asked := (1000*m.Input.Micro + 1000*m.Output.Micro + 999_999) / 1_000_000
	for _, tc := range []struct {
		models string
		want   int64
	}{{`["fake-gpt","dear-gpt"]`, 8 * asked}, {`["fake-gpt"]`, asked}} {
		logs.TakeAll()
		r, answer := h.answeredRun(u.ID, key, "/v1/chat/completions", `{"model":"fake-gpt","models":`+tc.models+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if r.CostMicro != tc.want {
			t.Errorf("models %s: run %+v (answer %s), want cost %d", tc.models, r, answer, tc.want)
		}
		if n := logs.FilterMessageSnippet("the model that answered has no price").FilterField(zap.String("answered", "mystery-1")).Len(); n == 0 {
			t.Errorf("models %s: the unpriced answer was not logged", tc.models)
		}
	}
}

// routerWithDearModel configures a router upstream at url serving every model, and dear-gpt,
// priced at 8× fake-gpt, for a call's fallback list.
func routerWithDearModel(url string) func(*config.Config) {
	return func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "router", Kind: "openai", BaseURL: url, Models: []string{"*"}}}
		dear := c.Models["fake-gpt"]
		dear.Input, dear.Output = config.USDPerM{Micro: 8 * dear.Input.Micro}, config.USDPerM{Micro: 8 * dear.Output.Micro}
		c.Models["dear-gpt"] = dear
	}
}
