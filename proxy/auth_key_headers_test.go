package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestKeyHeaderNotReadIsNotCheckedAndTheBearerKeyWins: x-api-key is read only on the routes
// Anthropic's clients call, so on any other route two x-api-key lines beside a valid Bearer key
// are no repeat of a key and the call is served; and where both headers come, the Bearer key is
// the one authenticated, so the call is charged to its user, not to the x-api-key's.
func TestKeyHeaderNotReadIsNotCheckedAndTheBearerKeyWins(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	other, otherKey := h.user("standard")
	req := h.newRequest(key, "/v1/chat/completions", chatBody, nil)
	req.Header.Add("X-Api-Key", otherKey)
	req.Header.Add("X-Api-Key", "sk-something-else")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/v1/chat/completions with a Bearer key and two x-api-key lines: %d %s, want 200", resp.StatusCode, out)
	}
	msg := `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	run, _ := h.answeredRun(u.ID, key, "/v1/messages", msg, map[string]string{"X-Api-Key": otherKey})
	if run.UserID != u.ID {
		t.Errorf("/v1/messages with Bearer and x-api-key: run of user %d, want the Bearer key's %d", run.UserID, u.ID)
	}
	// The x-api-key's user was charged nothing: it has no run at all.
	var n int
	if err := h.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE user_id = ?", other.ID); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the x-api-key's user has %d holds, want none", n)
	}
}

// TestRefusedCallersKeyIsNeverLogged: a request refused before its caller is known (a revoked
// key, a key in x-api-key on the Anthropic route, a key sent on two lines) writes one line, with
// its route and remote address, and never the key it sent, in any field: a log is read by more
// people than the keys' owners.
func TestRefusedCallersKeyIsNeverLogged(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, revoked := h.user("standard")
	_, live := h.user("standard")
	if _, err := h.store.RevokeAPIKey(context.Background(), revoked); err != nil {
		t.Fatal(err)
	}
	msg := `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, path, body, header string
		lines                    []string
		status                   int
	}{
		{"revoked Bearer key", "/v1/chat/completions", chatBody, "Authorization", []string{"Bearer " + revoked}, http.StatusUnauthorized},
		{"revoked x-api-key", "/v1/messages", msg, "X-Api-Key", []string{revoked}, http.StatusUnauthorized},
		{"Authorization twice", "/v1/chat/completions", chatBody, "Authorization", []string{"Bearer " + revoked, "Bearer " + live}, http.StatusBadRequest},
		{"x-api-key twice", "/v1/messages", msg, "X-Api-Key", []string{revoked, live}, http.StatusBadRequest},
	} {
		logs.TakeAll()
		req := h.newRequest("", tc.path, tc.body, nil)
		for _, l := range tc.lines {
			req.Header.Add(tc.header, l)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
		lines := logs.TakeAll()
		if len(lines) == 0 {
			t.Fatalf("%s: no line logged, want its refusal", tc.name)
		}
		for _, l := range lines {
			for k, v := range l.ContextMap() {
				s := fmt.Sprint(v)
				for _, key := range []string{revoked, live} {
					if strings.Contains(s, key) || strings.Contains(s, key[len(key)/2:]) {
						t.Errorf("%s: line %q field %s quotes the key it sent", tc.name, l.Message, k)
					}
				}
			}
		}
	}
}

// TestUnknownCallerIsCountedOnlyOnTheModelRoutes: a request refused for its key is counted in
// tollgate_requests_total only on the routes that metric is labelled with (the model routes and
// the token counter); on any other path, /v1/models/* and /v1/runs/{id} among them, which take
// any path a stranger sends, it is not, so no stranger's path becomes a label.
func TestUnknownCallerIsCountedOnlyOnTheModelRoutes(t *testing.T) {
	h := newHarness(t, nil)
	for _, path := range []string{"/v1/models/stranger-path-1", "/v1/runs/stranger-path-2", "/v1/credits"} {
		if status, _ := h.get("tg_wrong", path); status != http.StatusUnauthorized {
			t.Fatalf("GET %s with a wrong key: %d, want 401", path, status)
		}
	}
	resp := h.post("tg_wrong", "/v1/chat/completions", chatBody, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	series := h.metricSeries("tollgate_requests_total")
	counted := false
	for labels, n := range series {
		if strings.Contains(labels, "stranger-path") || strings.Contains(labels, "/v1/credits") {
			t.Errorf("tollgate_requests_total{%s} = %d: a refused stranger's path became a label", labels, n)
		}
		if strings.Contains(labels, `"/v1/chat/completions"`) && strings.Contains(labels, "401") && n == 1 {
			counted = true
		}
	}
	if !counted {
		t.Errorf("a wrong key on /v1/chat/completions was not counted 401 in tollgate_requests_total: %v", series)
	}
}
