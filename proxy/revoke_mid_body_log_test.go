package proxy_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

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
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			// The body's second half is sent once the key was looked up and then revoked.
			pr, pw := io.Pipe()
			defer pw.Close()
			revoked := make(chan struct{})
			go func() {
				half := len(chatBody) / 2
				if _, err := pw.Write([]byte(chatBody[:half])); err != nil {
					return
				}
				select {
				case <-revoked:
				case <-ctx.Done():
					return
				}
				if _, err := pw.Write([]byte(chatBody[half:])); err == nil {
					pw.Close()
				}
			}()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/chat/completions", pr)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+key)
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			type result struct {
				resp *http.Response
				err  error
			}
			answered := make(chan result, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				answered <- result{resp, err}
			}()
			waitFor(t, "the key looked up", func() bool {
				return h.metric(`tollgate_call_phase_seconds_count{phase="auth"}`) == "1"
			})
			if _, err := h.store.RevokeAPIKey(ctx, key); err != nil {
				t.Fatal(err)
			}
			close(revoked)
			a := <-answered
			if a.err != nil {
				t.Fatal(a.err)
			}
			body := readAll(t, a.resp.Body)
			a.resp.Body.Close()
			if a.resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
				t.Fatalf("%d %s, want 401 invalid_api_key", a.resp.StatusCode, body)
			}
			want := a.resp.Header.Get(proxy.RequestIDHeader) // a call's own run id names its request
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
