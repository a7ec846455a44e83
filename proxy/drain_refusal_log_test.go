package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/proxy"
)

// TestDrainRefusalNamesTheCallersRun: a call refused because the gateway is draining
// (503 shutting_down) logged as its run_id the run id it would have made for itself, also for a
// call of a named run, whose run is its X-Run-Id's: the line named a run that never existed,
// and the agent's run, which its other refusals name (readCall), was not found by it. It names
// the named run now, as a refusal of the call's body does, and a plain call's own run id still.
func TestDrainRefusalNamesTheCallersRun(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"plain", nil},
		{"named run", map[string]string{"X-Run-Id": "draining-agent"}},
	} {
		logs.TakeAll()
		resp := h.post(key, "/v1/chat/completions", chatBody, tc.hdr)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "shutting_down" {
			t.Fatalf("%s: %d %s, want 503 shutting_down", tc.name, resp.StatusCode, body)
		}
		want := resp.Header.Get(proxy.RequestIDHeader)
		if id := tc.hdr["X-Run-Id"]; id != "" {
			want = proxy.RunIDFor(u.ID, id)
		}
		lines := logs.FilterMessage("request refused").FilterField(zap.String("code", "shutting_down")).All()
		if len(lines) != 1 {
			t.Fatalf("%s: %d refusal lines, want 1: %v", tc.name, len(lines), logs.All())
		}
		if f := lines[0].ContextMap(); f["run_id"] != want || f["user_id"] != u.ID {
			t.Errorf("%s: refusal line names run %v user %v, want run %s user %d", tc.name, f["run_id"], f["user_id"], want, u.ID)
		}
	}
}
