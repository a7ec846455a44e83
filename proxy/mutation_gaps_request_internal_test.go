package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestOutputBoundIsTheLeastBoundTimesTheMostAnswers: the output a call may run to (what a
// named run's call reserves) is its least output bound, per answer, times the most answers
// any of its choice fields asks for, whichever order the body names them in: read as the
// last of n and best_of, a completions call of n=4, best_of=2 reserved for half its answers;
// read as the larger of two bounds, a chat call reserved for output it can never write.
func TestOutputBoundIsTheLeastBoundTimesTheMostAnswers(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name, path, body string
		want             int64
	}{
		{"completions, n above best_of", "/v1/completions", `{"model":"fake-gpt","n":4,"best_of":2,"max_tokens":100,"prompt":"p"}`, 400},
		{"completions, best_of above n", "/v1/completions", `{"model":"fake-gpt","best_of":4,"n":2,"max_tokens":100,"prompt":"p"}`, 400},
		{"chat, max_tokens the larger", "/v1/chat/completions",
			`{"model":"fake-gpt","n":2,"max_tokens":300,"max_completion_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, 200},
		{"chat, max_completion_tokens the larger", "/v1/chat/completions",
			`{"model":"fake-gpt","n":2,"max_tokens":100,"max_completion_tokens":300,"messages":[{"role":"user","content":"hi"}]}`, 200},
	} {
		c, aerr := s.parseCall(routeFor(t, tc.path), []byte(tc.body), hdr)
		if aerr != nil {
			t.Fatalf("%s: refused: %s", tc.name, aerr.Message)
		}
		if got := c.outputBound(0); got != tc.want {
			t.Errorf("%s: output bound %d tokens, want %d", tc.name, got, tc.want)
		}
	}
}

// TestNoBoundIsAddedWhenTheModelsLimitIsWhatTheCapPaysFor: a call sent without an output bound
// to a model whose configured limit the cap pays for exactly is forwarded as sent: the model
// cannot write past what the cap pays for, and the body is not edited for nothing.
func TestNoBoundIsAddedWhenTheModelsLimitIsWhatTheCapPaysFor(t *testing.T) {
	c := &callRequest{route: &route{maxFields: []string{"max_tokens"}}, maxOutput: -1, choices: 1}
	if got := c.addedBound(16_384, 16_384); got != 0 {
		t.Errorf("addedBound %d for a model whose limit is exactly what the cap pays for, want none", got)
	}
	if got := c.addedBound(16_384, 16_383); got != 16_383 {
		t.Errorf("addedBound %d for a model whose limit is a token past what the cap pays for, want 16383", got)
	}
}

// TestRewriteRefusesACapBelowTheRoutesLeastAnswer: a cap that pays for fewer output tokens per
// answer than the route's least bound (16 on /v1/responses, which OpenAI refuses below with
// integer_below_min_value; 1 elsewhere) pays for no answer, and the call is refused as a
// budget too small (402), whether or not it set a bound; a cap that pays for the least is
// forwarded with it. Forwarded with a bound below the least, the provider refused the call
// with a 400 about a bound its caller never sent; forwarded unbounded, it was served and its
// cost clamped away at settlement.
func TestRewriteRefusesACapBelowTheRoutesLeastAnswer(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name, path, body, field string
		least                   int64
	}{
		{"responses, bounded", "/v1/responses", `{"model":"fake-gpt","max_output_tokens":100,"input":"hi"}`, "max_output_tokens", 16},
		{"responses, unbounded", "/v1/responses", `{"model":"fake-gpt","input":"hi"}`, "", 16},
		{"chat, bounded", "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", 1},
		{"chat, unbounded", "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`, "", 1},
	} {
		for _, out := range []int64{tc.least - 1, tc.least} {
			c, aerr := s.parseCall(routeFor(t, tc.path), []byte(tc.body), hdr)
			if aerr != nil {
				t.Fatalf("%s: refused: %s", tc.name, aerr.Message)
			}
			capMicro := c.boundPrice().Cost(pricing.Usage{Input: c.promptEstimate().Input, Output: out})
			ok, err := c.rewrite(capMicro, s.cfg.Models[c.priceKey])
			if err != nil {
				t.Fatalf("%s: rewrite: %v", tc.name, err)
			}
			if want := out >= tc.least; ok != want {
				t.Errorf("%s: a cap paying for %d output tokens: forwarded %v, want %v", tc.name, out, ok, want)
				continue
			}
			if ok && tc.field != "" {
				if got := gjson.GetBytes(c.body, tc.field).Int(); got != tc.least {
					t.Errorf("%s: forwarded with %s=%d, want %d", tc.name, tc.field, got, tc.least)
				}
			}
		}
	}
}

// TestRewriteLowersTheThinkingBudgetWithTheBound: when the rewrite lowers an extended-thinking
// call's max_tokens to what the cap pays for, it lowers budget_tokens below it too (Anthropic
// refuses a budget not below max_tokens: a 400 about a bound the caller never sent, after a
// hold), and a cap that leaves less than the least thinking budget below the bound is refused
// as a budget too small.
func TestRewriteLowersTheThinkingBudgetWithTheBound(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	body := `{"model":"fake-claude","max_tokens":10000,"thinking":{"type":"enabled","budget_tokens":8000},"messages":[{"role":"user","content":"think"}]}`
	for _, tc := range []struct {
		out        int64 // output tokens the cap pays for
		ok         bool
		max, think int64 // forwarded
	}{
		{3000, true, 3000, 2999},
		{minThinkingBudget, false, 0, 0},
	} {
		c, aerr := s.parseCall(routeFor(t, anthropicPath), []byte(body), hdr)
		if aerr != nil {
			t.Fatalf("refused: %s", aerr.Message)
		}
		capMicro := c.boundPrice().Cost(pricing.Usage{Input: c.promptEstimate().Input, Output: tc.out})
		ok, err := c.rewrite(capMicro, s.cfg.Models[c.priceKey])
		if err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		if ok != tc.ok {
			t.Errorf("a cap paying for %d output tokens: forwarded %v, want %v", tc.out, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if got := gjson.GetBytes(c.body, "max_tokens").Int(); got != tc.max {
			t.Errorf("a cap paying for %d output tokens: max_tokens %d, want %d", tc.out, got, tc.max)
		}
		if got := gjson.GetBytes(c.body, "thinking.budget_tokens").Int(); got != tc.think {
			t.Errorf("a cap paying for %d output tokens: budget_tokens %d, want %d, below max_tokens", tc.out, got, tc.think)
		}
	}
}

// TestRequestLimitsHoldAtTheirBounds: a model name of holds.MaxModelLen bytes and a fallback
// list of maxFallbacks models are served; a byte or a model more is refused 400 with its own
// code before anything is held (a name the hold's column cannot store failed the admission
// batch it shared with other callers').
func TestRequestLimitsHoldAtTheirBounds(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	rt := routeFor(t, "/v1/chat/completions")
	models := func(n int) string {
		return `[` + strings.TrimSuffix(strings.Repeat(`"fake-gpt",`, n), ",") + `]`
	}
	name := func(n int) string { return "fake-gpt-" + strings.Repeat("x", n-len("fake-gpt-")) }
	for _, tc := range []struct {
		name, body, code string // code "": served
	}{
		{"a model name of the most bytes", `{"model":"` + name(holds.MaxModelLen) + `","messages":[]}`, ""},
		{"a model name a byte longer", `{"model":"` + name(holds.MaxModelLen+1) + `","messages":[]}`, "model_too_long"},
		{"the most fallbacks", `{"model":"fake-gpt","models":` + models(maxFallbacks) + `,"messages":[]}`, ""},
		{"a fallback more", `{"model":"fake-gpt","models":` + models(maxFallbacks+1) + `,"messages":[]}`, "invalid_models"},
	} {
		_, aerr := s.parseCall(rt, []byte(tc.body), hdr)
		switch {
		case tc.code == "" && aerr != nil:
			t.Errorf("%s: refused %d %s: %s", tc.name, aerr.Status, aerr.Code, aerr.Message)
		case tc.code != "" && (aerr == nil || aerr.Status != http.StatusBadRequest || aerr.Code != tc.code):
			t.Errorf("%s: %+v, want 400 %s", tc.name, aerr, tc.code)
		}
	}
}

// TestTokenArrayPromptIsOnePrompt: a completions prompt of token ids ([1,2,3]) is one prompt,
// answered n times and echoed once; an array of token arrays is a batch, each prompt answered n
// times and echoed on its own. Read as a batch of one-token prompts, a token-array call
// reserved (and bounded its output by) an answer per token id, and its echo was stripped from
// the output as one prompt per id.
func TestTokenArrayPromptIsOnePrompt(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name, prompt string
		prompts      int
	}{
		{"a token array", `[1,2,3]`, 1},
		{"a batch of token arrays", `[[1,2],[3,4]]`, 2},
	} {
		body := `{"model":"fake-gpt","n":2,"echo":true,"max_tokens":100,"prompt":` + tc.prompt + `}`
		c, aerr := s.parseCall(routeFor(t, "/v1/completions"), []byte(body), hdr)
		if aerr != nil {
			t.Fatalf("%s: refused: %s", tc.name, aerr.Message)
		}
		if got, want := c.outputBound(0), int64(tc.prompts*2*100); got != want {
			t.Errorf("%s: output bound %d tokens, want %d (%d prompts, n=2, max_tokens=100)", tc.name, got, want, tc.prompts)
		}
		if len(c.echoPrompts) != tc.prompts {
			t.Errorf("%s: %d prompts echoed, want %d", tc.name, len(c.echoPrompts), tc.prompts)
		}
	}
}

// TestRepeatedKeyPastTheFirstKeysIsFound: repeatedKey compares an object's first keysBeforeSet
// keys one by one and then in a set: a key repeated (in another case too) after the set is
// made is found whichever of the first keys it repeats, and an empty key, a key once, is no
// repeat however many keys come before it. Among the first keys, a key in another case is a
// repeat too.
func TestRepeatedKeyPastTheFirstKeysIsFound(t *testing.T) {
	obj := func(extra string) gjson.Result {
		var b strings.Builder
		b.WriteString("{")
		for i := range keysBeforeSet + 2 {
			b.WriteString(`"k` + strconv.Itoa(i) + `":0,`)
		}
		return gjson.Parse(b.String() + extra + "}")
	}
	for _, tc := range []struct {
		extra, want string
		found       bool
	}{
		{`"end":1`, "", false},
		{`"k0":1`, "k0", true},
		{`"K0":1`, "K0", true},
		{`"k15":1`, "k15", true},
		{`"":1`, "", false},
	} {
		if got, found := repeatedKey(obj(tc.extra)); got != tc.want || found != tc.found {
			t.Errorf("%d keys then %s: repeatedKey %q, %v; want %q, %v", keysBeforeSet+2, tc.extra, got, found, tc.want, tc.found)
		}
	}
	if got, found := repeatedKey(gjson.Parse(`{"k0":0,"K0":1}`)); got != "K0" || !found {
		t.Errorf("two keys in another case: repeatedKey %q, %v; want \"K0\", true", got, found)
	}
}

// TestFallbackNamingAChainIsRefused: a fallback list's entry that names several models
// ("fake-gpt,dear", a chain a router falls back along, each at its own rates) is refused 400
// invalid_models before anything is held, in every fallback list, as the model asked for is:
// priced by its prefix, it was reckoned at the first model's price alone.
func TestFallbackNamingAChainIsRefused(t *testing.T) {
	s := fuzzServer(t)
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, field := range []string{`"models"`, `"fallbacks"`} {
		body := `{"model":"fake-gpt",` + field + `:["fake-gpt","fake-gpt,dear"],"messages":[]}`
		_, aerr := s.parseCall(routeFor(t, "/v1/chat/completions"), []byte(body), hdr)
		if aerr == nil || aerr.Status != http.StatusBadRequest || aerr.Code != "invalid_models" {
			t.Errorf("%s naming a chain: %+v, want 400 invalid_models", field, aerr)
		}
	}
}
