package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestFitsPromptAgreesWithTheRewrite: admitFitting keeps a hold fitsPrompt accepts, and
// fitBudget then forwards the call only if its rewrite fits it in the same cap: a hold kept
// that the rewrite refuses is the 402 the wait was for, and one released that it would have
// taken refuses a call that fitted. fitsPrompt's shortcut (a cap past any least answer) must
// say what the rewrite says, for every route's least answer, extended thinking, several
// answers and a discount, at caps around each call's least cost, each one output token's
// cost apart: stepped past, the cap where the shortcut's bound is met exactly went untried.
func TestFitsPromptAgreesWithTheRewrite(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	long := strings.Repeat("word ", 500)
	// A batch of more prompts than the shortcut's bound (1 025) has fewer output tokens per
	// answer than the whole: the shortcut must count per answer (limit/choices), or a cap
	// whose output share rounds to no token each passed it, the hold kept for a 402.
	manyPrompts := `"` + strings.Repeat(`a","`, 1099) + `a"`
	for _, tc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"chat bounded, three answers", "/v1/chat/completions", `{"model":"fake-gpt","n":3,"max_tokens":4000,"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"stream", "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"completions", "/v1/completions", `{"model":"fake-gpt","max_tokens":3000,"prompt":["` + long + `","` + long + `"]}`},
		{"completions, a batch of 1 100 prompts", "/v1/completions", `{"model":"fake-gpt","prompt":[` + manyPrompts + `]}`},
		{"responses", "/v1/responses", `{"model":"fake-gpt","max_output_tokens":3000,"input":"` + long + `"}`},
		{"embeddings", "/v1/embeddings", `{"model":"fake-gpt","input":"` + long + `"}`},
		{"anthropic thinking", anthropicPath, `{"model":"fake-claude","max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":6000},` +
			`"messages":[{"role":"user","content":"` + long + `"}]}`},
	} {
		rt := routeFor(t, tc.path)
		probe, aerr := s.parseCall(rt, []byte(tc.body), hdr)
		if aerr != nil {
			t.Fatalf("%s: refused: %s", tc.name, aerr.Message)
		}
		least := probe.boundPrice().Cost(probe.promptEstimate())
		step := max(1, probe.boundPrice().Cost(pricing.Usage{Output: 1}))
		seen := map[bool]bool{}
		for _, discount := range []int{0, 2500} {
			for i := int64(-3); i < 3000; i++ {
				capMicro := least + i*step
				c, _ := s.parseCall(rt, []byte(tc.body), hdr)
				h := holds.Hold{CapMicro: capMicro, DiscountBP: discount}
				got := fitsPrompt(c, s.cfg.Models[c.priceKey])(h)
				body := string(c.body)
				want, err := c.rewrite(pricing.MaxCostWithin(capMicro, discount), s.cfg.Models[c.priceKey])
				if err != nil {
					t.Fatalf("%s: rewrite: %v", tc.name, err)
				}
				if got != want {
					t.Fatalf("%s: cap %d at %d bp: fitsPrompt %v, the rewrite %v", tc.name, capMicro, discount, got, want)
				}
				if body != tc.body {
					t.Fatalf("%s: fitsPrompt edited the call's body", tc.name)
				}
				seen[got] = true
			}
		}
		if !seen[true] || !seen[false] {
			t.Errorf("%s: caps tried gave fitsPrompt only %v; want caps on both sides of the least cost", tc.name, seen)
		}
	}
}
