package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestHoldTierFollowsUserTurns: DESIGN §3 step 3 — the hold is hold_normal (20 credits), or
// hold_heavy (60) when the conversation has at least heavy_after_turns (4) user turns.
func TestHoldTierFollowsUserTurns(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	turns := func(n int) string {
		var msgs []string
		for i := 0; i < n; i++ {
			msgs = append(msgs, `{"role":"user","content":"question `+strings.Repeat("x", i+1)+`"}`,
				`{"role":"assistant","content":"answer"}`)
		}
		return `{"model":"fake-gpt","max_tokens":5,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	for _, tc := range []struct {
		turns int
		held  int64
	}{{1, 20_000}, {3, 20_000}, {4, 60_000}, {6, 60_000}} {
		resp := h.post(key, "/v1/chat/completions", turns(tc.turns), nil)
		b := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%d turns: status %d: %s", tc.turns, resp.StatusCode, b)
		}
		r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if r.HeldMicro != tc.held {
			t.Errorf("%d user turns: held %d, want %d", tc.turns, r.HeldMicro, tc.held)
		}
	}
}

// TestAdmissionRefusalsCarryTheDesignCodes: DESIGN §3 step 3 and §8 — past max_in_flight is
// 429 too_many_in_flight with Retry-After; nothing available is 402 insufficient_credits.
func TestAdmissionRefusalsCarryTheDesignCodes(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()

	busy, busyKey := h.user("standard")
	zero := 0
	if err := h.store.SetUserLimits(ctx, busy.ID, nil, &zero, nil); err != nil {
		t.Fatal(err)
	}
	resp := h.post(busyKey, "/v1/chat/completions", chatBody, nil)
	b := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, b) != "too_many_in_flight" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("past max_in_flight: %d %s Retry-After=%q; want 429 too_many_in_flight with Retry-After",
			resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}

	broke, brokeKey := h.user("standard")
	var none int64
	if err := h.store.SetUserLimits(ctx, broke.ID, &none, nil, nil); err != nil {
		t.Fatal(err)
	}
	resp = h.post(brokeKey, "/v1/chat/completions", chatBody, nil)
	b = readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired || errorCode(t, b) != "insufficient_credits" {
		t.Errorf("nothing available: %d %s; want 402 insufficient_credits", resp.StatusCode, b)
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Errorf("%d holds left by refused admissions, want none", all)
	}
}
