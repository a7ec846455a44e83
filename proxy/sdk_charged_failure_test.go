package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// chargedFailureUpstream answers each call as the case its prompt names says (the prompt holds
// "case:<case>-<sdk>"), and counts the calls of each.
type chargedFailureUpstream struct {
	mu    sync.Mutex
	calls map[string]int
}

func (f *chargedFailureUpstream) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *chargedFailureUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	name := "ok"
	if _, after, found := strings.Cut(string(b), "case:"); found {
		name, _, _ = strings.Cut(after, `"`)
	}
	f.mu.Lock()
	f.calls[name]++
	f.mu.Unlock()
	kind := name[:max(0, strings.LastIndex(name, "-"))]
	switch kind {
	case "no-headers": // the provider works past the gateway's time without a word
		<-r.Context().Done()
	case "slow-body": // it answers, and does not finish in time
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion",`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case "empty": // a 200 with nothing in it
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
	case "cut": // the connection breaks inside the answer (its Content-Length says more)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "4096")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello bill`)
	case "refused": // the provider fails the call outright: charged nothing
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"boom","type":"server_error"}}`)
	default:
		http.Error(w, "unexpected case "+kind, http.StatusBadRequest)
	}
}

// A failure the caller is charged for — the provider had the prompt, and worked on it — must
// not be sent again by the SDK on its own: the OpenAI and Anthropic SDKs retry a 5xx twice by
// default, each retry another call charged again, and the caller, who sees one error, pays
// three times for no answer. Such a failure says X-Should-Retry: false, without Retry-After;
// one charged nothing (the provider's own refusal) is still retried, at no cost.
func TestSDKDoesNotResendAChargedFailure(t *testing.T) {
	up := &chargedFailureUpstream{calls: map[string]int{}}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{
			{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"fake-gpt"}},
			{Name: "hostile-anthropic", Kind: "anthropic", BaseURL: srv.URL, Models: []string{"claude-test"}},
		}
		c.Limits.UpstreamTimeout = timeoutAfterTheRequest
		c.Limits.HeaderTimeout = timeoutAfterTheRequest
	})
	for _, tc := range []struct {
		name, code string
		status     int
		charged    bool
		source     string
	}{
		{"no-headers", "upstream_timeout", http.StatusGatewayTimeout, true, holds.SourceUpstreamTimeout},
		{"slow-body", "upstream_timeout", http.StatusGatewayTimeout, true, holds.SourceUpstreamTimeout},
		{"empty", "upstream_broken", http.StatusBadGateway, true, holds.SourceStreamError},
		{"cut", "upstream_broken", http.StatusBadGateway, true, holds.SourceStreamError},
		{"refused", "", 0, false, holds.SourceUpstreamError}, // a 5xx, as the route words it
	} {
		for _, sdk := range []string{"openai", "anthropic"} {
			t.Run(tc.name+"/"+sdk, func(t *testing.T) {
				u, key := h.user("standard")
				name := tc.name + "-" + sdk
				prompt := "case:" + name
				var statuses, should, retryAfter []string
				record := func(res *http.Response) {
					if res == nil {
						statuses, should, retryAfter = append(statuses, "none"), append(should, ""), append(retryAfter, "")
						return
					}
					statuses = append(statuses, fmt.Sprint(res.StatusCode))
					should, retryAfter = append(should, res.Header.Get("X-Should-Retry")), append(retryAfter, res.Header.Get("Retry-After"))
				}
				var status int
				var code string
				if sdk == "openai" {
					c := sdkClient(h, key, nil, option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
						res, err := next(req)
						record(res)
						return res, err
					}))
					_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "fake-gpt",
						Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
					var apiErr *openai.Error
					if !errors.As(err, &apiErr) {
						t.Fatalf("err %v, want an API error", err)
					}
					status, code = apiErr.StatusCode, apiErr.Code
				} else {
					var log aLog
					c := aClient(h, key, &log, aopt.WithMiddleware(func(req *http.Request, next aopt.MiddlewareNext) (*http.Response, error) {
						res, err := next(req)
						record(res)
						return res, err
					}))
					_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "claude-test", MaxTokens: 64,
						Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}})
					var apiErr *anthropic.Error
					if !errors.As(err, &apiErr) {
						t.Fatalf("err %v, want an API error", err)
					}
					status = apiErr.StatusCode
				}
				if (tc.status != 0 && status != tc.status) || status < 500 || (tc.code != "" && sdk == "openai" && code != tc.code) {
					t.Fatalf("answered %d %q, want %d %q", status, code, tc.status, tc.code)
				}
				runs := h.holdsOf(u.ID)
				var charged int
				for _, r := range runs {
					if r.State != holds.StateSettled || r.SettleSource.String != tc.source {
						t.Errorf("run %s: %s, settled by %q; want settled by %s", r.RunID, r.State, r.SettleSource.String, tc.source)
					}
					if r.ChargedMicro > 0 {
						charged++
					}
				}
				if !tc.charged {
					// Charged nothing: the SDK's retries are free, and still invited.
					if n := up.count(name); n != 3 || charged != 0 {
						t.Errorf("the upstream was called %d times, %d charged (attempts %v); want the SDK's 3 attempts, none charged",
							n, charged, statuses)
					}
					return
				}
				if n := up.count(name); n != 1 || len(statuses) != 1 || charged != 1 {
					t.Errorf("the SDK made %d attempts %v (X-Should-Retry %q, Retry-After %q), the upstream was called %d times, %d charged; "+
						"want one attempt, charged once", len(statuses), statuses, should, retryAfter, n, charged)
				}
				if len(should) > 0 && (should[0] != "false" || retryAfter[0] != "") {
					t.Errorf("charged failure answered with X-Should-Retry %q, Retry-After %q; want false and none", should[0], retryAfter[0])
				}
			})
		}
	}
}
