package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// A plain stream whose upstream sends [DONE] and then neither closes nor sends anything: the
// caller's answer is whole; the call must not hold its hold and in-flight slot (nor keep the
// caller's connection open) until upstream_timeout. upstream_timeout is an hour here, so a call
// that waited for it never ends: the bound below catches that hang, it does not time the call.
func TestHostilePlainStreamUpstreamHangsAfterDone(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, hostileChunk)
		fmt.Fprint(w, hostileUsage)
		fmt.Fprint(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = time.Hour })
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	defer resp.Body.Close()
	cr := readInBackground(resp.Body)
	select {
	case <-cr.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the answer was whole at once, but the call was still open 30 s later (upstream_timeout %v): it waits for the upstream to close",
			h.cfg.Limits.UpstreamTimeout)
	}
	if body := cr.bytes(); !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("no [DONE]: %s", body)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Fatalf("run %+v", run)
	}
}
