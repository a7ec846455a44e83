package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestOpenAICacheWritesAreBoundWithinTheCap: OpenAI caches a prompt without being asked (no
// cache_control), and its newer models (gpt-5.6 on) bill the tokens they write to the cache at
// a price of their own, 1.25× the input price, reported as input_tokens_details.
// cache_write_tokens. A model priced with such a cache_write had its output bound reckoned with
// the prompt at the input price, as if nothing would be written: a call whose cap binds (a user
// near the end of the balance, a named run near its budget) that wrote its prompt to the cache
// cost more than its cap, the charge was clamped and the operator paid the provider the rest.
func TestOpenAICacheWritesAreBoundWithinTheCap(t *testing.T) {
	// A Responses upstream that writes the whole prompt it is told of to the cache and answers
	// as long as max_output_tokens allows.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		written, _ := strconv.ParseInt(r.Header.Get("X-Test-Written"), 10, 64)
		out := int64(100_000)
		if mt := gjson.GetBytes(body, "max_output_tokens"); mt.Exists() && mt.Int() < out {
			out = mt.Int()
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","status":"completed","model":"fake-gpt","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}],`+
			`"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			written, written, out, written+out)
	}))
	t.Cleanup(up.Close)
	var price pricing.Price
	h := newHarness(t, func(c *config.Config) {
		for i := range c.Upstreams {
			if c.Upstreams[i].Kind == "openai" {
				c.Upstreams[i].BaseURL = up.URL
			}
		}
		p := c.Plans["standard"]
		p.MaxRunCostCredits = config.CreditsOf(60)
		c.Plans["standard"] = p
		table, err := c.PriceTable()
		if err != nil {
			t.Fatal(err)
		}
		price, _, _ = table.Lookup("fake-gpt")
	})
	if price.CacheWrite <= price.Input {
		t.Fatalf("fake-gpt's cache-write price %d is no dearer than its input price %d", price.CacheWrite, price.Input)
	}
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","max_output_tokens":10000,"instructions":"` + strings.Repeat("You are a careful coding agent. ", 1300) + `","input":"fix the bug"}`
	est, _ := metering.EstimatePrompt(metering.FormatResponses, []byte(body))
	resp, answer := h.postOK(t, key, "/v1/responses", body, map[string]string{"X-Test-Written": strconv.FormatInt(est, 10)})
	out := gjson.GetBytes(answer, "usage.output_tokens").Int()
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	cost := price.Cost(pricing.Usage{CacheWrite: est, Output: out})
	if r.CostMicro != cost {
		t.Fatalf("run cost %d, want %d", r.CostMicro, cost)
	}
	if cost > r.CapMicro {
		t.Fatalf("the call cost %d µUSD (%d tokens written to the cache, %d output): past its cap %d, charged %d; "+
			"the operator paid the provider %d µUSD nobody was charged", cost, est, out, r.CapMicro, r.ChargedMicro, cost-r.ChargedMicro)
	}
}
