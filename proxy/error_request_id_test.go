package proxy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/tollgate/tollgate/proxy"
)

// TestGatewayErrorsCarryTheRequestIdTheSDKsRead: the SDKs name a failed call by the request id
// of its answer — the Anthropic SDK puts the `Request-Id` header in its error's message, the
// OpenAI SDKs keep `X-Request-Id` on theirs — and a user who reports "my call failed" quotes
// that. An error the gateway words itself before any provider answered (a refusal) carried
// neither, only X-Tollgate-Request-Id, which no SDK reads: the report named nothing the
// operator could find in the log. Each now carries the request id under the SDK's name too.
func TestGatewayErrorsCarryTheRequestIdTheSDKsRead(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")

	t.Run("anthropic SDK", func(t *testing.T) {
		var l aLog
		p := aParams
		p.Model = "claude-nobody-serves"
		c := aClient(h, key, &l, aopt.WithMaxRetries(0))
		_, err := c.Messages.New(context.Background(), p)
		var ae *anthropic.Error
		if !errors.As(err, &ae) || ae.StatusCode < 400 {
			t.Fatalf("a model no upstream serves: %v, want the gateway's refusal", err)
		}
		id := ae.Response.Header.Get(proxy.RequestIDHeader)
		if id == "" || ae.RequestID != id {
			t.Fatalf("the SDK's error names request %q; the gateway's request id is %q (%v)", ae.RequestID, id, err)
		}
	})
	t.Run("OpenAI route", func(t *testing.T) {
		resp := h.post(key, "/v1/chat/completions", `{"model":"nobody-serves-this","messages":[{"role":"user","content":"hi"}]}`, nil)
		resp.Body.Close()
		id := resp.Header.Get(proxy.RequestIDHeader)
		if resp.StatusCode < 400 || id == "" || resp.Header.Get("X-Request-Id") != id {
			t.Fatalf("refusal %d: X-Request-Id %q, the gateway's request id %q; want the same", resp.StatusCode,
				resp.Header.Get("X-Request-Id"), id)
		}
	})
}
