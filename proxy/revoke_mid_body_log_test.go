package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestKeyRevokedWhileItsBodyArrivesLogsTheRun: a call refused because its key was revoked
// while its body arrived (keyStillLive) logged its "request refused" line without run_id,
// where every other refusal of a call's body names the run it would be a call of — the named
// run of its X-Run-Id, else the run id it made for itself (README: "its run_id and user_id
// once known"). An operator looking an agent's run up found its other refusals, not this one.
func TestKeyRevokedWhileItsBodyArrivesLogsTheRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"plain", nil},
		{"named run", map[string]string{"X-Run-Id": "revoked-agent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) { c.Limits.KeyCacheTTL = 0 })
			u, key := h.user("standard")
			resp := postWhileKeyStops(t, h, key, tc.hdr, func(ctx context.Context) error {
				_, err := h.store.RevokeAPIKey(ctx, key)
				return err
			})
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
				t.Fatalf("%d %s, want 401 invalid_api_key", resp.StatusCode, body)
			}
			want := resp.Header.Get(proxy.RequestIDHeader) // a call's own run id names its request
			if id := tc.hdr["X-Run-Id"]; id != "" {
				want = proxy.RunIDFor(u.ID, id)
			}
			lines := logs.FilterMessage("request refused").FilterField(zap.String("code", "invalid_api_key")).All()
			if len(lines) != 1 {
				t.Fatalf("%d refusal lines, want 1: %v", len(lines), logs.All())
			}
			if f := lines[0].ContextMap(); f["run_id"] != want || f["user_id"] != u.ID {
				t.Errorf("refusal line names run %v user %v, want run %s user %d: %v", f["run_id"], f["user_id"], want, u.ID, f)
			}
		})
	}
}
