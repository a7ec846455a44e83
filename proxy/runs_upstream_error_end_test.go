package proxy_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestNamedRunCallEndedByTheProvidersErrorIsTalliedBeforeItsCallerSeesIt: the provider's own
// error event ends a named run's call for its caller (the SDKs raise on it), as a final event
// or the gateway's upstream_broken does: a settle sent the moment the caller has it must
// charge the call, not be told 409 run_busy for a call it saw end. Here the upstream keeps its
// connection open after the error (the Responses API sends response.failed after it; a
// provider may be slow to close): the call was in flight, its lease held, until the upstream
// let go — up to upstream_timeout — and the run could not be settled meanwhile.
func TestNamedRunCallEndedByTheProvidersErrorIsTalliedBeforeItsCallerSeesIt(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello billing team, here is the start of an answer.\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\"}}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "up", Kind: "openai", BaseURL: up.URL, Models: []string{"fake-gpt"}}}
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, map[string]string{"X-Run-Id": "task-provider-error"})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the provider's error: %v", err)
		}
		if strings.Contains(line, "The server had an error") {
			break
		}
	}
	status, body := h.settleRun(key, "task-provider-error")
	if status != http.StatusOK {
		t.Fatalf("settle sent once the provider's error event arrived: %d %s, want 200", status, body)
	}
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if r.Calls != 1 || r.OutTok == 0 || r.ChargedMicro == 0 {
		t.Fatalf("settled run %+v: want the call charged its prompt and the output it streamed before the error", r)
	}
}
