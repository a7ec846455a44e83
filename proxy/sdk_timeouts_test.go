package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// A call answered whole (not streamed) gets its headers only with its whole answer, which a
// reasoning model or a long output may take minutes to write: limits.header_timeout, meant for a
// stream's headers, must not cut it before limits.upstream_timeout. Cut, it was answered 504,
// charged its prompt's estimate, and retried by the SDK twice, each retry cut and charged
// again: three charges and no answer.
func TestSDKNonStreamedCallSlowerThanHeaderTimeoutIsAnsweredAndChargedOnce(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.HeaderTimeout = 300 * time.Millisecond })
	u, key := h.user("standard")
	var log attemptLog
	c := sdkClient(h, key, &log, option.WithHeader(fakellm.HeaderLatency, "900ms"))
	for _, tc := range []struct {
		name string
		call func() (*http.Response, error)
	}{
		{"chat", func() (*http.Response, error) {
			var raw *http.Response
			_, err := c.Chat.Completions.New(context.Background(), sdkParams, option.WithResponseInto(&raw))
			return raw, err
		}},
		{"responses", func() (*http.Response, error) {
			var raw *http.Response
			_, err := c.Responses.New(context.Background(), responsesParams("a long answer"), option.WithResponseInto(&raw))
			return raw, err
		}},
		{"embeddings", func() (*http.Response, error) {
			var raw *http.Response
			_, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "fake-gpt",
				Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("toll gate")}}, option.WithResponseInto(&raw))
			return raw, err
		}},
	} {
		before := len(log.all())
		raw, err := tc.call()
		atts := log.all()[before:]
		if err != nil {
			t.Errorf("%s: %v after %d attempts (%+v); want the answer", tc.name, err, len(atts), atts)
			continue
		}
		if len(atts) != 1 {
			t.Errorf("%s: %d attempts, want 1", tc.name, len(atts))
		}
		if r := h.run(u.ID, raw.Header.Get(proxy.RunIDHeader)); r.SettleSource.String != "complete" || r.Estimated {
			t.Errorf("%s: run settled %s (estimated %v), want complete", tc.name, r.SettleSource.String, r.Estimated)
		}
	}
	var charged int
	if err := h.db.Get(&charged, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND charged_micro > 0", u.ID); err != nil {
		t.Fatal(err)
	}
	if charged != 3 {
		t.Errorf("%d runs charged for 3 answered calls", charged)
	}
}

// A stream's headers come before its first token: one that does not send them within
// limits.header_timeout is cut (504 upstream_timeout, charged its prompt's estimate, since the
// provider had the prompt), without waiting for limits.upstream_timeout.
func TestStreamWhoseHeadersDoNotComeIsCutAtHeaderTimeout(t *testing.T) {
	// header_timeout runs from before the request is written: at 300 ms a loaded machine could
	// still be writing when it ran out, and the call, never sent whole, was charged 0.
	h := newHarness(t, func(c *config.Config) { c.Limits.HeaderTimeout = timeoutAfterTheRequest })
	u, key := h.user("standard")
	c := sdkClient(h, key, nil, option.WithHeader(fakellm.HeaderLatency, "1m"), option.WithMaxRetries(0))
	var raw *http.Response
	s := c.Chat.Completions.NewStreaming(context.Background(), sdkParams, option.WithResponseInto(&raw))
	for s.Next() {
	}
	var apiErr *openai.Error
	if !errors.As(s.Err(), &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout || apiErr.Code != "upstream_timeout" {
		t.Fatalf("err %v, want 504 upstream_timeout", s.Err())
	}
	if r := h.run(u.ID, raw.Header.Get(proxy.RunIDHeader)); r.SettleSource.String != "upstream_timeout" || r.ChargedMicro == 0 {
		t.Errorf("run settled %s charged %d, want the prompt's estimate as upstream_timeout", r.SettleSource.String, r.ChargedMicro)
	}
}
