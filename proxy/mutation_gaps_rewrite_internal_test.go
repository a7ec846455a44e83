package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/pricing"
)

// rewriteServer is fuzzServer with a one-hour cache-write price on the Anthropic model, so a
// ttl of 1h is priced (else refused as an unpriced option).
func rewriteServer(t *testing.T) *Server {
	t.Helper()
	cfg := config.Default()
	m := cfg.Models["fake-gpt"]
	m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
	cfg.Models["fake-claude"] = m
	cfg.Upstreams = append(cfg.Upstreams, config.Upstream{Name: "a", Kind: "anthropic", BaseURL: "http://127.0.0.1:9", Models: []string{"fake-claude"}})
	prices, err := cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	return &Server{cfg: cfg, prices: prices}
}

// TestMutationGapRewriteLowersEveryBoundToTheMostTheCapPays: where the worst case would pass
// the cap, every output field the body carries is lowered to exactly the most output each of
// its answers may write within the cap — not a token more (the cap is passed), and not a token
// less (the caller gets a shorter answer than it paid for). The answers are the most of n and
// best_of, times the prompts of a completions batch; the prompt is reckoned at the price the
// provider may bill it at: the cache-write price on the OpenAI-shaped routes (fake-gpt's
// cache_write is dearer than its input), and on Anthropic's only when marked, the one-hour
// price for a ttl of 1h. The oracle prices the whole answer with pricing.Cost, independently
// of the rewrite's own arithmetic.
func TestMutationGapRewriteLowersEveryBoundToTheMostTheCapPays(t *testing.T) {
	s := rewriteServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	gpt, claude := s.cfg.Models["fake-gpt"], s.cfg.Models["fake-claude"]
	long := strings.Repeat("word ", 400)
	const huge = 90_000_000
	for _, tc := range []struct {
		name, path, body string
		fields           []string
		answers          int64 // answers the call may write, each up to the bound
		inputMicro       int64 // the price per million prompt tokens the worst case is reckoned at
	}{
		{"chat, both fields, n=3", "/v1/chat/completions",
			`{"model":"fake-gpt","n":3,"max_tokens":90000000,"max_completion_tokens":90000000,"messages":[{"role":"user","content":"` + long + `"}]}`,
			[]string{"max_tokens", "max_completion_tokens"}, 3, gpt.CacheWrite.Micro},
		{"chat stream, max_completion_tokens only", "/v1/chat/completions",
			`{"model":"fake-gpt","stream":true,"max_completion_tokens":90000000,"messages":[{"role":"user","content":"` + long + `"}]}`,
			[]string{"max_completion_tokens"}, 1, gpt.CacheWrite.Micro},
		{"completions, best_of=4 above n=2", "/v1/completions",
			`{"model":"fake-gpt","n":2,"best_of":4,"max_tokens":90000000,"prompt":"` + long + `"}`,
			[]string{"max_tokens"}, 4, gpt.CacheWrite.Micro},
		{"completions batch of 3 prompts, n=2", "/v1/completions",
			`{"model":"fake-gpt","n":2,"max_tokens":90000000,"prompt":["` + long + `","` + long + `","` + long + `"]}`,
			[]string{"max_tokens"}, 6, gpt.CacheWrite.Micro},
		{"responses", "/v1/responses",
			`{"model":"fake-gpt","max_output_tokens":90000000,"input":"` + long + `"}`,
			[]string{"max_output_tokens"}, 1, gpt.CacheWrite.Micro},
		{"anthropic unmarked", anthropicPath,
			`{"model":"fake-claude","max_tokens":90000000,"messages":[{"role":"user","content":"` + long + `"}]}`,
			[]string{"max_tokens"}, 1, claude.Input.Micro},
		{"anthropic cache_control", anthropicPath,
			`{"model":"fake-claude","max_tokens":90000000,"messages":[{"role":"user","content":[{"type":"text","text":"` + long +
				`","cache_control":{"type":"ephemeral"}}]}]}`,
			[]string{"max_tokens"}, 1, claude.CacheWrite.Micro},
		{"anthropic cache_control ttl 1h", anthropicPath,
			`{"model":"fake-claude","max_tokens":90000000,"messages":[{"role":"user","content":[{"type":"text","text":"` + long +
				`","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`,
			[]string{"max_tokens"}, 1, claude.CacheWrite1h.Micro},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := routeFor(t, tc.path)
			c, aerr := s.parseCall(rt, []byte(tc.body), hdr)
			if aerr != nil {
				t.Fatalf("refused: %s", aerr.Message)
			}
			price := pricing.Price{Input: tc.inputMicro, Output: gpt.Output.Micro}
			cost := func(perAnswer int64) int64 {
				return price.Cost(pricing.Usage{Input: c.promptEstimate().Input, Output: perAnswer * tc.answers})
			}
			// A cap that pays for the prompt and 1000.5 tokens per answer at the bound's price:
			// well below the bound asked for, and between two whole answers.
			capMicro := cost(1000) + (cost(1001)-cost(1000))/2
			ok, err := c.rewrite(capMicro, s.cfg.Models[c.priceKey])
			if err != nil || !ok {
				t.Fatalf("rewrite: %v, %v; want the call forwarded with a lower bound", ok, err)
			}
			for _, f := range tc.fields {
				got := gjson.GetBytes(c.body, f).Int()
				if got >= huge {
					t.Fatalf("%s not lowered: %d", f, got)
				}
				if cost(got) > capMicro {
					t.Errorf("%s lowered to %d: %d answers of it cost %d µUSD, past the cap %d", f, got, tc.answers, cost(got), capMicro)
				}
				if cost(got+1) <= capMicro {
					t.Errorf("%s lowered to %d: %d answers of %d tokens still fit in the cap %d (cost %d)", f, got, tc.answers, got+1, capMicro, cost(got+1))
				}
			}
		})
	}
}

// TestMutationGapRewriteLeavesABoundThatFitsAlone: a bound whose worst case fits in the cap is
// forwarded as the caller sent it, byte for byte — one token under the most the cap pays for,
// or exactly it — and one a token above it is lowered to it.
func TestMutationGapRewriteLeavesABoundThatFitsAlone(t *testing.T) {
	s := rewriteServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	rt := routeFor(t, "/v1/chat/completions")
	probe, aerr := s.parseCall(rt, []byte(`{"model":"fake-gpt","n":2,"messages":[{"role":"user","content":"hi"}]}`), hdr)
	if aerr != nil {
		t.Fatalf("refused: %s", aerr.Message)
	}
	const most = 700 // output tokens per answer the cap pays for
	capMicro := probe.boundPrice().Cost(pricing.Usage{Input: probe.promptEstimate().Input, Output: 2 * most})
	for _, tc := range []struct {
		bound, want int64
	}{{most - 1, most - 1}, {most, most}, {most + 1, most}} {
		body := `{"model":"fake-gpt","n":2,"max_tokens":` + strconv.FormatInt(tc.bound, 10) + `,"max_completion_tokens":` + strconv.FormatInt(tc.bound, 10) +
			`,"messages":[{"role":"user","content":"hi"}]}`
		c, aerr := s.parseCall(rt, []byte(body), hdr)
		if aerr != nil {
			t.Fatalf("refused: %s", aerr.Message)
		}
		if ok, err := c.rewrite(capMicro, s.cfg.Models[c.priceKey]); err != nil || !ok {
			t.Fatalf("bound %d: rewrite %v, %v", tc.bound, ok, err)
		}
		for _, f := range []string{"max_tokens", "max_completion_tokens"} {
			if got := gjson.GetBytes(c.body, f).Int(); got != tc.want {
				t.Errorf("bound %d: upstream would get %s=%d, want %d", tc.bound, f, got, tc.want)
			}
		}
		if tc.bound <= most && string(c.body) != body {
			t.Errorf("bound %d fits the cap, yet the body was edited:\n%s", tc.bound, c.body)
		}
	}
}
