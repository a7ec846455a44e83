package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestHoldTierFollowsUserTurnsOnEveryRoute: DESIGN §3 step 3 — the hold is hold_normal (20
// credits), or hold_heavy (60) from heavy_after_turns (4) user turns, on the Anthropic
// Messages route (its messages) and the Responses route (its input items, in the short and the
// typed message form) as on chat completions (TestHoldTierFollowsUserTurns). Legacy
// completions and embeddings carry no conversation: always the normal tier.
func TestHoldTierFollowsUserTurnsOnEveryRoute(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	conversation := func(n int, user, assistant string) string {
		var items []string
		for i := 0; i < n; i++ {
			items = append(items, fmt.Sprintf(user, "question "+strings.Repeat("x", i+1)), fmt.Sprintf(assistant, "answer"))
		}
		return strings.Join(items, ",")
	}
	const (
		shortUser      = `{"role":"user","content":%q}`
		shortAssistant = `{"role":"assistant","content":%q}`
		typedUser      = `{"type":"message","role":"user","content":[{"type":"input_text","text":%q}]}`
		typedAssistant = `{"type":"message","role":"assistant","content":[{"type":"output_text","text":%q}]}`
	)
	routes := []struct {
		name, path string
		body       func(turns int) string
	}{
		{"messages", "/v1/messages", func(n int) string {
			return `{"model":"claude-test","max_tokens":5,"messages":[` + conversation(n, shortUser, shortAssistant) + `]}`
		}},
		{"responses", "/v1/responses", func(n int) string {
			return `{"model":"fake-gpt","max_output_tokens":16,"input":[` + conversation(n, shortUser, shortAssistant) + `]}`
		}},
		{"responses, typed items", "/v1/responses", func(n int) string {
			return `{"model":"fake-gpt","max_output_tokens":17,"input":[` + conversation(n, typedUser, typedAssistant) + `]}`
		}},
	}
	for _, rt := range routes {
		for _, tc := range []struct {
			turns int
			held  int64
		}{{1, 20_000}, {3, 20_000}, {4, 60_000}, {6, 60_000}} {
			r, answer := h.answeredRun(u.ID, key, rt.path, rt.body(tc.turns), nil)
			if r.HeldMicro != tc.held {
				t.Errorf("%s, %d user turns: held %d, want %d (%.200s)", rt.name, tc.turns, r.HeldMicro, tc.held, answer)
			}
		}
	}

	// No conversation: the normal tier, however many "user" strings the body holds.
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"fake-gpt","max_tokens":5,"prompt":["user","user","user","user","user"]}`},
		{"/v1/embeddings", `{"model":"fake-gpt","input":["user","user","user","user","user"]}`},
	} {
		resp, _ := h.postOK(t, key, c.path, c.body, nil)
		if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.HeldMicro != 20_000 {
			t.Errorf("%s: held %d, want hold_normal's 20000", c.path, r.HeldMicro)
		}
	}
}
