package proxy_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestKeyRevokedWhileItsBodyArrivesIsNotAdmitted: README promises that a revoked key is refused
// within key_cache_ttl (none with the cache off, ttl 0). A call's key is looked up when its
// headers arrive, and its body may take minutes more (a large prompt on a slow link: a body is
// cut only below 1 KiB/s on average). A key revoked meanwhile — a leaked key an operator stops —
// must not have the call admitted, forwarded and charged to its user once the body is in: the
// call is refused 401 invalid_api_key and nothing is held. So does a user disabled meanwhile,
// whom admission refuses under the user's row lock.
func TestKeyRevokedWhileItsBodyArrivesIsNotAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(ctx context.Context, h *harness, u holds.User, key string) error
	}{
		{"key revoked", func(ctx context.Context, h *harness, _ holds.User, key string) error {
			_, err := h.store.RevokeAPIKey(ctx, key)
			return err
		}},
		{"user disabled", func(ctx context.Context, h *harness, u holds.User, _ string) error {
			_, err := h.store.DisableUser(ctx, u.ID)
			return err
		}},
		// A key that names another user once its body is read (keyStillLive) is refused as a
		// revoked one: a store that says otherwise is not to be charged by, and neither user is
		// held or charged.
		{"key names another user", func(ctx context.Context, h *harness, _ holds.User, key string) error {
			other, _ := h.user("standard")
			hash := holds.HashKey(key)
			_, err := h.db.ExecContext(ctx, "UPDATE api_keys SET user_id = ? WHERE key_hash = ?", other.ID, hash[:])
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) { c.Limits.KeyCacheTTL = 0 })
			u, key := h.user("standard")
			resp := postWhileKeyStops(t, h, key, nil, func(ctx context.Context) error { return tc.stop(ctx, h, u, key) })
			body := readAll(t, resp.Body)
			resp.Body.Close()
			h.settled()
			if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
				t.Errorf("call whose key was stopped while its body arrived: %d %s, want 401 invalid_api_key", resp.StatusCode, body)
			}
			if all, _ := h.holdCount(); all != 0 {
				var charged int64
				if err := h.db.Get(&charged, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds"); err != nil {
					t.Fatal(err)
				}
				t.Errorf("%d holds taken (charged %d µUSD) for a call whose key was stopped before it was admitted, want none", all, charged)
			}
		})
	}
}

// postWhileKeyStops posts chatBody with key (and the headers hdr) whose body comes in two parts:
// the second only once the key was looked up (the auth phase observed) and stop (a revocation,
// a disabled user) has run. It returns the call's answer.
func postWhileKeyStops(t *testing.T, h *harness, key string, hdr map[string]string, stop func(context.Context) error) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	stopped := make(chan struct{})
	go func() {
		half := len(chatBody) / 2
		if _, err := pw.Write([]byte(chatBody[:half])); err != nil {
			return
		}
		select {
		case <-stopped:
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
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		answered <- answer{resp, err}
	}()
	// The auth phase is observed once the key's lookup has come back from the store.
	waitFor(t, "the key looked up", func() bool {
		return h.metric(`tollgate_call_phase_seconds_count{phase="auth"}`) == "1"
	})
	if err := stop(ctx); err != nil {
		t.Fatal(err)
	}
	close(stopped)
	a := <-answered
	if a.err != nil {
		t.Fatal(a.err)
	}
	return a.resp
}
