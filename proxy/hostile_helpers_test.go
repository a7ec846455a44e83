package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

const hostileChunk = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
	"Hello billing team, here is a fairly long answer for you.\"}}]}\n\n"
const hostileUsage = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":400,\"total_tokens\":410}}\n\n"

// hostileHarness is a gateway whose only upstream is the handler given.
func hostileHarness(t *testing.T, upstream http.HandlerFunc, mutate func(*config.Config)) *harness {
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	return newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
		if mutate != nil {
			mutate(c)
		}
	})
}
