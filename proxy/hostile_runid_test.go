package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// An upstream (a second tollgate in front of the provider, say) that sends its own
// X-Tollgate-Run-Id and X-Tollgate-Request-Id must not replace the ids this gateway tells its
// caller.
func TestHostileUpstreamCannotRenameTheRun(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(proxy.RunIDHeader, "r_inner")
		w.Header().Set(proxy.RequestIDHeader, "r_inner")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	}, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Values(proxy.RunIDHeader); len(got) != 1 || got[0] == "r_inner" {
		t.Fatalf("X-Tollgate-Run-Id = %q, want this gateway's run id only", got)
	}
	if got := resp.Header.Values(proxy.RequestIDHeader); len(got) != 1 || got[0] != resp.Header.Get(proxy.RunIDHeader) {
		t.Fatalf("X-Tollgate-Request-Id = %q, want this gateway's (%s) only", got, resp.Header.Get(proxy.RunIDHeader))
	}
}
