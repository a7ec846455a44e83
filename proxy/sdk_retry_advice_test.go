package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// retryAdvisingUpstream is the fake upstream answering every call as it does, with the retry
// advice given: a router or provider whose headers say "retry" on its answers too.
func retryAdvisingUpstream(t *testing.T, advice map[string]string, calls *atomic.Int64) string {
	fake := fakellm.New(fakellm.Config{FixturesDir: testenv.FixturesDir(t)})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		for k, v := range advice {
			w.Header().Set(k, v)
		}
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The OpenAI and Anthropic Go SDKs read X-Should-Retry on every answer, a 200 too: "true"
// makes them drop the answer and send the call again (openai-go's shouldRetry, anthropic-sdk-go's
// retryHeader, before the status is looked at). An upstream's answer that said so, relayed,
// had the SDK throw away an answer the gateway charged and ask again: one call, three
// answers charged, by default. A provider's retry advice belongs to its refusals (the 5xx and
// 4xx it is relayed with); a 2xx is the answer, and goes out without it.
func TestSDKDoesNotResendAnAnswerTheUpstreamAdvisedRetrying(t *testing.T) {
	var calls atomic.Int64
	url := retryAdvisingUpstream(t, map[string]string{"X-Should-Retry": "true", "Retry-After-Ms": "0"}, &calls)
	h := newHarness(t, func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL = url
		}
	})
	u, key := h.user("standard")
	var charged []string
	one := func(what string, attempts int, raw *http.Response, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if n := calls.Swap(0); attempts != 1 || n != 1 {
			t.Errorf("%s: the SDK made %d attempts, the upstream was called %d times; want 1: the answer was whole", what, attempts, n)
		}
		if v := raw.Header.Get("X-Should-Retry"); v != "" {
			t.Errorf("%s: answered 200 with X-Should-Retry %q", what, v)
		}
		charged = append(charged, raw.Header.Get(proxy.RunIDHeader))
	}

	var log attemptLog
	c := sdkClient(h, key, &log, option.WithHeader(fakellm.HeaderChunks, "5"))
	var raw *http.Response
	_, err := c.Chat.Completions.New(context.Background(), sdkParams, option.WithResponseInto(&raw))
	one("chat", len(log.all()), raw, err)

	before := len(log.all())
	p := sdkParams
	p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream it.")}
	s := c.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&raw))
	for s.Next() {
	}
	one("chat stream", len(log.all())-before, raw, s.Err())

	var al aLog
	ac := aClient(h, key, &al)
	var araw *http.Response
	_, err = ac.Messages.New(context.Background(), aParams, aopt.WithResponseInto(&araw))
	one("messages", len(al.st), araw, err)

	h.expectCharges(u.ID, charged)
}

// failFirstAttempt makes the fake upstream refuse the SDK's first attempt of each call with
// status (the SDK numbers its attempts in X-Stainless-Retry-Count), so that its retry is served.
func failFirstAttempt(status string) option.RequestOption {
	return option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		if req.Header.Get("X-Stainless-Retry-Count") == "0" {
			req.Header.Set(fakellm.HeaderStatus, status)
		}
		return next(req)
	})
}

// A call the SDK retries after the provider failed its first attempt is charged once: the
// failed attempt at 0, the answered retry its usage. Under an Idempotency-Key the retry runs
// (the failure did not pin the key), and the same call sent again afterwards is replayed, not
// charged again.
func TestSDKCallRetriedAfterAProviderFailureIsChargedOnce(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct {
		name string
		opts []option.RequestOption
	}{
		{"plain", nil},
		{"idempotent", []option.RequestOption{option.WithHeader("Idempotency-Key", "sdk-retried-1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, key := h.user("standard")
			var log attemptLog
			c := sdkClient(h, key, &log, append(tc.opts, failFirstAttempt("503"), option.WithHeader(fakellm.HeaderChunks, "6"))...)
			var raw *http.Response
			res, err := c.Chat.Completions.New(context.Background(), sdkParams, option.WithResponseInto(&raw))
			if err != nil {
				t.Fatal(err)
			}
			atts := log.all()
			if len(atts) != 2 || atts[0].status != http.StatusBadGateway || atts[1].status != http.StatusOK {
				t.Fatalf("attempts %+v, want a 502 and then the answer", atts)
			}
			runs := h.expectCharges(u.ID, []string{raw.Header.Get(proxy.RunIDHeader)}, "upstream_error")
			if len(runs) != 2 {
				t.Fatalf("%d runs, want the failed attempt's and the answered one's", len(runs))
			}
			if tc.opts == nil {
				return
			}
			again, err := c.Chat.Completions.New(context.Background(), sdkParams, option.WithResponseInto(&raw))
			if err != nil {
				t.Fatal(err)
			}
			if raw.Header.Get("Idempotent-Replayed") != "true" || again.Choices[0].Message.Content != res.Choices[0].Message.Content {
				t.Errorf("the same call sent again was not replayed (Idempotent-Replayed %q)", raw.Header.Get("Idempotent-Replayed"))
			}
			if n := len(h.holdsOf(u.ID)); n != 2 {
				t.Errorf("%d runs after the replay, want 2: a replay takes no hold", n)
			}
		})
	}
}
