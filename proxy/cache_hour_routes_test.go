package proxy_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// routerHourUsage is the usage of routerHourFixtures' chat answer: 600 cache writes in the
// total only (OpenRouter's prompt_tokens_details.cache_write_tokens), as a chat answer reports
// them whatever their ttl.
var (
	routerHourWritten = pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 600, Output: 20}
	routerShortWrites = pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, Output: 20}
)

// routerHourFixtures writes router_cache.json, the chat answer of a router serving Claude
// (router-claude) that wrote 600 prompt tokens to the cache.
func routerHourFixtures(t *testing.T) string {
	dir := t.TempDir()
	writeFixture(t, dir, "router_cache.json", `{"id":"gen-1","object":"chat.completion","model":"router-claude","choices":[{"index":0,
"message":{"role":"assistant","content":"Python is versatile."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":1000,"completion_tokens":20,"total_tokens":1020,
"prompt_tokens_details":{"cached_tokens":100,"cache_write_tokens":600,"audio_tokens":0}}}`)
	// LiteLLM's chat usage breaks the writes down by ttl, as Anthropic's does.
	writeFixture(t, dir, "litellm_cache.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"router-claude","choices":[{"index":0,
"message":{"role":"assistant","content":"Python is versatile."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":1000,"completion_tokens":20,"total_tokens":1020,
"prompt_tokens_details":{"cached_tokens":100,"text_tokens":300,"cache_write_tokens":600,"cache_creation_tokens":600,
"cache_creation_token_details":{"ephemeral_5m_input_tokens":200,"ephemeral_1h_input_tokens":400}},
"cache_creation_input_tokens":600,"cache_read_input_tokens":100}}`)
	return dir
}

// routerHourPrices prices router-claude (routed to the OpenAI-shaped upstream, as a router
// serving Claude is) with a one-hour cache write price, router-short without one.
func routerHourPrices(c *config.Config) {
	m := c.Models["fake-gpt"]
	c.Models["router-short"] = m
	m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
	c.Models["router-claude"] = m
}

// routerCacheBody is a chat request for model whose system prompt asks for a cache of ttl.
func routerCacheBody(model, cacheControl string) string {
	return `{"model":"` + model + `","messages":[{"role":"system","content":[{"type":"text","text":"be brief","cache_control":` +
		cacheControl + `}]},{"role":"user","content":"hi"}]}`
}

// routerClaudePrice is the price the gateway charges router-claude at.
func routerClaudePrice(t *testing.T, h *harness) pricing.Price {
	t.Helper()
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	price, _, err := table.Lookup("router-claude")
	if err != nil {
		t.Fatal(err)
	}
	return price
}

// TestOneHourCacheOnTheOpenAIRoutes: a router serving Claude on the OpenAI-shaped routes
// (OpenRouter, LiteLLM) passes a cache_control's ttl of 1h on to Anthropic, which bills the
// writes at the one-hour price (2× the input price, not 1.25×); the chat usage reports the
// writes' total only. The one-hour check ran on /v1/messages alone, and the writes were billed
// at the five-minute price. Now: refused 400 unpriced_option, with nothing held, on every route
// for a model (or a fallback in `models`) without a cache_write_1h price; with it, the writes
// a chat answer reports for a call that asked for an hour are all billed at it (unless the
// usage says which were, as LiteLLM's does), and a call that asked for five minutes, or named
// no ttl, is billed as before.
func TestOneHourCacheOnTheOpenAIRoutes(t *testing.T) {
	h := newHarnessWithFixtures(t, routerHourFixtures(t), routerHourPrices)
	price := routerClaudePrice(t, h)
	u, key := h.user("standard")
	hour := `{"type":"ephemeral","ttl":"1h"}`
	for _, tc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", routerCacheBody("router-short", hour)},
		{"responses", "/v1/responses", `{"model":"router-short","input":[{"role":"user","content":[{"type":"input_text","text":"hi","cache_control":` + hour + `}]}]}`},
		{"completions", "/v1/completions", `{"model":"router-short","prompt":"hi","cache_control":` + hour + `}`},
		{"fallback without the price", "/v1/chat/completions",
			`{"model":"router-claude","models":["router-claude","router-short"],"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":` + hour + `}]}]}`},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			h.postRefused(t, key, tc.path, tc.body, nil, http.StatusBadRequest, "unpriced_option")
		})
	}

	replay := map[string]string{fakellm.HeaderReplay: "router_cache.json"}
	for _, tc := range []struct {
		name, cacheControl string
		want               pricing.Usage
	}{
		{"1h", hour, routerHourWritten},
		{"5m", `{"type":"ephemeral","ttl":"5m"}`, routerShortWrites},
		{"no ttl", `{"type":"ephemeral"}`, routerShortWrites},
	} {
		run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", routerCacheBody("router-claude", tc.cacheControl), replay)
		if run.Usage() != tc.want || run.CacheWrite1hTok != tc.want.CacheWrite1h {
			t.Errorf("%s: settled with %+v (cache_write_1h_tok %d), want %+v", tc.name, run.Usage(), run.CacheWrite1hTok, tc.want)
		}
		if want := price.Cost(tc.want); run.CostMicro != want || run.ChargedMicro != want {
			t.Errorf("%s: cost %d charged %d, want %d", tc.name, run.CostMicro, run.ChargedMicro, want)
		}
	}
	// A usage that says which writes were the one-hour ones (LiteLLM's
	// prompt_tokens_details.cache_creation_token_details) is billed as it says.
	split := pricing.Usage{Input: 300, CacheRead: 100, CacheWrite: 600, CacheWrite1h: 400, Output: 20}
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", routerCacheBody("router-claude", hour),
		map[string]string{fakellm.HeaderReplay: "litellm_cache.json"})
	if run.Usage() != split || run.CostMicro != price.Cost(split) {
		t.Errorf("writes broken down by ttl: settled with %+v cost %d, want %+v cost %d", run.Usage(), run.CostMicro, split, price.Cost(split))
	}
	if hourCost, short := price.Cost(routerHourWritten), price.Cost(routerShortWrites); hourCost <= short {
		t.Fatalf("the test's one-hour cost %d is no more than its five-minute one %d", hourCost, short)
	}
}

// TestOneHourCacheOnTheOpenAIRoutesReconciledFromTheTally: the chat call asking for an hour's
// cache is never settled by its process (its settlement gave up, the database out of reach):
// the reconciler settles it from the tally, which must carry its writes as one-hour ones.
func TestOneHourCacheOnTheOpenAIRoutesReconciledFromTheTally(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db, fixturesDir: routerHourFixtures(t)}, func(c *config.Config) {
		routerHourPrices(c)
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
	})
	price := routerClaudePrice(t, h)
	u, key := h.user("standard")
	resp := postSettlementLost(t, h, lossy, key, "/v1/chat/completions", routerCacheBody("router-claude", `{"type":"ephemeral","ttl":"1h"}`),
		map[string]string{fakellm.HeaderReplay: "router_cache.json"})
	if st := h.reconcileExpired(t, "user_id = ? AND state = 'running'", u.ID); st.FromTally != 1 {
		t.Fatalf("reconcile: %+v; want the run settled from its tally", st)
	}
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if r.SettleSource.String != holds.SourceReconcile || r.Usage() != routerHourWritten || r.CacheWrite1hTok != 600 {
		t.Errorf("settled by %q with %+v, want by the reconciler with %+v", r.SettleSource.String, r.Usage(), routerHourWritten)
	}
	if want := price.Cost(routerHourWritten); r.CostMicro != want || r.ChargedMicro != want {
		t.Errorf("cost %d charged %d, want %d (the 600 writes at the one-hour price)", r.CostMicro, r.ChargedMicro, want)
	}
}
