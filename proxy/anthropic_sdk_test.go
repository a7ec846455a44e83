package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
)

type aLog struct {
	mu sync.Mutex
	st []int
	sh []string
}

func (l *aLog) mw() aopt.Middleware {
	return func(req *http.Request, next aopt.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		l.mu.Lock()
		if res != nil {
			l.st = append(l.st, res.StatusCode)
			l.sh = append(l.sh, res.Header.Get("X-Should-Retry"))
		} else {
			l.st = append(l.st, 0)
			l.sh = append(l.sh, "")
		}
		l.mu.Unlock()
		return res, err
	}
}

func aClient(h *harness, key string, l *aLog, opts ...aopt.RequestOption) anthropic.Client {
	base := []aopt.RequestOption{aopt.WithBaseURL(h.gw.URL + "/"), aopt.WithAPIKey(key),
		aopt.WithMiddleware(l.mw())}
	return anthropic.NewClient(append(base, opts...)...)
}

var aParams = anthropic.MessageNewParams{Model: "claude-test", MaxTokens: 64,
	Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))}}

// sdkReadable checks that the Anthropic SDK surfaces a gateway error usefully: its status, a
// message and Anthropic's error type for it.
func sdkReadable(t *testing.T, what string, status int, errType string, err error) {
	t.Helper()
	var ae *anthropic.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%s: not an API error: %v", what, err)
	}
	if ae.StatusCode != status || ae.Message == "" || string(ae.Type()) != errType {
		t.Errorf("%s: the SDK read status %d, type %q, message %q from %s; want %d, %s and a message",
			what, ae.StatusCode, ae.Type(), ae.Message, ae.RawJSON(), status, errType)
	}
}

func TestAnthropicSDKReadsGatewayErrors(t *testing.T) {
	h := newHarness(t, func(c *configT) {
		p := c.Plans["standard"]
		c.Plans["broke"] = p
	})
	_, key := h.user("standard")
	var l aLog
	// 401
	c := aClient(h, "nope", &l, aopt.WithMaxRetries(0))
	_, err := c.Messages.New(context.Background(), aParams)
	sdkReadable(t, "401", 401, "authentication_error", err)
	// 400 missing model priced
	c = aClient(h, key, &l, aopt.WithMaxRetries(0))
	p := aParams
	p.Model = "claude-unpriced-zzz"
	_, err = c.Messages.New(context.Background(), p)
	sdkReadable(t, "400", 400, "invalid_request_error", err)
	// The token counter reaches the upstream's (Claude Code asks it every turn).
	n, err := c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "claude-test",
		Messages: aParams.Messages})
	if err != nil || n.InputTokens <= 0 {
		t.Errorf("count_tokens: %+v, %v; want the upstream's count", n, err)
	}
}

func TestAnthropicSDKDoesNotRetryASettledRun(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	var l aLog
	c := aClient(h, key, &l, aopt.WithHeader("X-Run-Id", "agent-1"))
	if _, err := c.Messages.New(context.Background(), aParams); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if st, b := h.settleRun(key, "agent-1"); st != 200 {
		t.Fatalf("settle: %d %s", st, b)
	}
	n := len(l.st)
	_, err := c.Messages.New(context.Background(), aParams)
	t.Logf("attempts %v should %v err %v", l.st[n:], l.sh[n:], err)
	if len(l.st[n:]) != 1 {
		t.Errorf("retried a settled run")
	}
	sdkReadable(t, "409", 409, "invalid_request_error", err)
}

func TestAnthropicSDKSeesABrokenStream(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	var l aLog
	c := aClient(h, key, &l, aopt.WithMaxRetries(0), aopt.WithHeader(fakellm.HeaderChunks, "9"),
		aopt.WithHeader(fakellm.HeaderDropAfter, "3"))
	s := c.Messages.NewStreaming(context.Background(), aParams)
	n := 0
	for s.Next() {
		n++
	}
	err := s.Err()
	t.Logf("events %d err %v", n, err)
	if err == nil {
		t.Fatal("broken stream read as clean end")
	}
}

var _ = config.Plan{}

// anthropicLikeUpstream answers /v1/messages as Anthropic does, including its validation of
// max_tokens (>= 1) and of extended thinking (budget_tokens < max_tokens).
func anthropicLikeUpstream(seen *[]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			MaxTokens int64 `json:"max_tokens"`
			Thinking  *struct {
				Type         string `json:"type"`
				BudgetTokens int64  `json:"budget_tokens"`
			} `json:"thinking"`
		}
		raw, _ := io.ReadAll(r.Body)
		*seen = append(*seen, string(raw))
		_ = json.Unmarshal(raw, &b)
		w.Header().Set("Content-Type", "application/json")
		bad := ""
		switch {
		case b.MaxTokens < 1:
			bad = "max_tokens: Input should be greater than or equal to 1"
		case b.Thinking != nil && b.Thinking.Type == "enabled" && b.Thinking.BudgetTokens >= b.MaxTokens:
			bad = "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"
		}
		if bad != "" {
			w.WriteHeader(400)
			_, _ = w.Write([]byte(`{"type":"error","error":{"type":"invalid_request_error","message":` + strconvQuote(bad) + `}}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3}}`))
	}
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// A thinking request from a caller whose cap allows fewer output tokens than its thinking
// budget: the gateway lowers max_tokens below thinking.budget_tokens and forwards a request
// Anthropic must refuse. The caller gets a 400 about a max_tokens it never sent.
func TestThinkingBudgetFitsALoweredMaxTokens(t *testing.T) {
	var seen []string
	srv := httptestServer(t, anthropicLikeUpstream(&seen))
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "a", Kind: "anthropic", BaseURL: srv, Models: []string{"claude*"}}}
		p := c.Plans["standard"]
		p.MaxRunCostCredits = config.CreditsOf(60) // 0.06 USD: ~6 000 output tokens of claude-test
		c.Plans["standard"] = p
	})
	_, key := h.user("standard")
	var l aLog
	c := aClient(h, key, &l, aopt.WithMaxRetries(0))
	p := aParams
	p.MaxTokens = 16000
	p.Thinking = anthropic.ThinkingConfigParamOfEnabled(10000)
	msg, err := c.Messages.New(context.Background(), p)
	for _, s := range seen {
		t.Logf("forwarded: %s", s)
	}
	if err != nil {
		var ae *anthropic.Error
		if errors.As(err, &ae) && ae.StatusCode == http.StatusPaymentRequired {
			return // refused as over budget: fine
		}
		t.Fatalf("thinking call within the caller's means failed: %v", err)
	}
	t.Logf("ok: %+v", msg.Usage)
}

// A caller whose remaining credits pay for the prompt and not one output token: the gateway
// forwards max_tokens: 0 (which Anthropic refuses with 400) instead of answering 402.
func TestMaxTokensNeverLoweredToZero(t *testing.T) {
	var seen []string
	srv := httptestServer(t, anthropicLikeUpstream(&seen))
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "a", Kind: "anthropic", BaseURL: srv, Models: []string{"claude*"}}}
	})
	_, key := h.user("standard")
	var l aLog
	c := aClient(h, key, &l, aopt.WithMaxRetries(0))
	// Find a prompt whose estimate costs exactly the cap: price in is 2.5 USD/M; cap = 0.5 USD
	// => 200 000 input tokens exactly (4 bytes per token, plus 4 per message).
	text := strings.Repeat("abcd", 200_000-4-10)
	for extra := 0; extra < 20; extra++ {
		p := aParams
		p.MaxTokens = 100
		p.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text + strings.Repeat("abcd", extra)))}
		seen = seen[:0]
		_, err := c.Messages.New(context.Background(), p)
		var ae *anthropic.Error
		if errors.As(err, &ae) && ae.StatusCode == 402 {
			t.Logf("extra %d: 402", extra)
			break
		}
		for _, s := range seen {
			var b struct {
				MaxTokens int64 `json:"max_tokens"`
			}
			_ = json.Unmarshal([]byte(s), &b)
			t.Logf("extra %d: forwarded max_tokens=%d err=%v", extra, b.MaxTokens, err)
			if b.MaxTokens < 1 {
				t.Fatalf("forwarded max_tokens %d; the caller got %v instead of 402", b.MaxTokens, err)
			}
		}
	}
}

func httptestServer(t *testing.T, h http.HandlerFunc) string {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

// TestThinkingCallRefused402BelowTheLeastThinkingBudget: README's 402 insufficient_credits
// row: an Anthropic extended-thinking call whose cap pays for its prompt and fewer than 1 025
// output tokens (max_tokens above Anthropic's least budget_tokens, 1 024) is refused, its hold
// released at 0, where a call without thinking is forwarded with max_tokens lowered; with
// room for more, the thinking budget is lowered below the lowered max_tokens.
func TestThinkingCallRefused402BelowTheLeastThinkingBudget(t *testing.T) {
	const thinking = `{"model":"claude-test","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":2000},"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, body string
		credits    int64 // the plan's holds and cap: 1 credit = 0.001 USD = 100 output tokens of claude-test
		forwarded  bool
	}{
		{"thinking, room for ~800", thinking, 8, false},
		{"no thinking, room for ~800", `{"model":"claude-test","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}`, 8, true},
		{"thinking, room for ~1 500", thinking, 15, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []string
			srv := httptestServer(t, anthropicLikeUpstream(&seen))
			h := newHarness(t, func(c *configT) {
				c.Upstreams = []config.Upstream{{Name: "a", Kind: "anthropic", BaseURL: srv, Models: []string{"claude*"}}}
				p := c.Plans["standard"]
				p.HoldNormalCredits, p.HoldHeavyCredits = config.CreditsOf(tc.credits), config.CreditsOf(tc.credits)
				p.MaxRunCostCredits = config.CreditsOf(tc.credits)
				c.Plans["standard"] = p
			})
			_, key := h.user("standard")
			resp := h.post(key, "/v1/messages", tc.body, nil)
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			status := resp.StatusCode
			if !tc.forwarded {
				if status != http.StatusPaymentRequired || !strings.Contains(string(answer), "insufficient_credits") || len(seen) != 0 {
					t.Fatalf("%d %s (forwarded %d), want 402 insufficient_credits, nothing forwarded", status, answer, len(seen))
				}
				h.settled()
				var charged int64
				if err := h.db.Get(&charged, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds"); err != nil {
					t.Fatal(err)
				}
				if all, live := h.holdCount(); live != 0 || charged != 0 {
					t.Fatalf("%d holds, %d live, charged %d µUSD: want the hold released at 0", all, live, charged)
				}
				return
			}
			if status != http.StatusOK || len(seen) != 1 {
				t.Fatalf("%d %s (forwarded %d), want 200", status, answer, len(seen))
			}
			t.Logf("forwarded %s", seen[0])
		})
	}
}

// TestAnthropicClientKeyInXAPIKeyListsModels: the Anthropic SDKs for Python and TypeScript send
// the key as x-api-key on every route they call, models.list and models.retrieve
// (GET /v1/models[/{id}]) as well as /v1/messages. Such a client must be served the models its
// calls are billed under, not told its valid key is invalid.
func TestAnthropicClientKeyInXAPIKeyListsModels(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	c := anthropic.NewClient(aopt.WithBaseURL(h.gw.URL+"/"), aopt.WithHeader("X-Api-Key", key), aopt.WithMaxRetries(0))
	ctx := context.Background()
	if _, err := c.Messages.New(ctx, aParams); err != nil {
		t.Fatalf("a model call with x-api-key: %v", err)
	}
	it := c.Models.ListAutoPaging(ctx, anthropic.ModelListParams{})
	var listed []string
	for it.Next() {
		listed = append(listed, it.Current().ID)
	}
	if err := it.Err(); err != nil || len(listed) == 0 {
		t.Errorf("models.list with x-api-key: %v, listed %v", err, listed)
	}
	if m, err := c.Models.Get(ctx, "claude-test", anthropic.ModelGetParams{}); err != nil || m.ID != "claude-test" {
		t.Errorf("models.retrieve with x-api-key: %v", err)
	}
}
