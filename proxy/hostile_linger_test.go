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
// caller's connection open) until upstream_timeout.
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
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = 30 * time.Second })
	u, key := h.user("standard")
	start := time.Now()
	resp := h.post(key, "/v1/chat/completions", streamBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("no [DONE]: %s", body)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.SettleSource.String != holds.SourceComplete || run.OutTok != 400 {
		t.Fatalf("run %+v", run)
	}
	if took > 5*time.Second {
		t.Fatalf("the answer was whole at once, but the call lasted %v (upstream_timeout %v)", took, h.cfg.Limits.UpstreamTimeout)
	}
}
