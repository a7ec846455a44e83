package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
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

// TestClientThatLeavesStopsTheUpstream: DESIGN §3 step 6 — the upstream request is bound to
// the client's context, so a client that leaves stops the generation (it stops costing
// money), whether it leaves mid-stream or while a non-streamed answer is being generated.
func TestClientThatLeavesStopsTheUpstream(t *testing.T) {
	stopped := make(chan string, 4)
	generating := make(chan struct{}, 4) // a non-streamed answer's generation has begun
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		stream := strings.Contains(string(body), `"stream":true`)
		defer func() { stopped <- fmt.Sprintf("stream=%v", stream) }()
		if !stream {
			generating <- struct{}{}
			// A long generation: nothing is sent until it is done.
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 2000; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) { c.Upstreams[0].BaseURL = up.URL })
	u, key := h.user("standard")

	// Mid-stream.
	runID := streamThenLeave(t, h, key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`, `"content":"tok`, 5)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream stream went on after the client left")
	}
	if r := h.run(u.ID, runID); r.SettleSource.String != "cancel" {
		t.Errorf("stream run settled %q, want cancel", r.SettleSource.String)
	}

	// While a non-streamed answer is generated: the client leaves once the generation has
	// begun (a client leaving after a fixed 300 ms left before the call was forwarded when its
	// admission was slow on a busy machine, and the generation this tests never began).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-generating:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("non-stream call answered %d before the client left", resp.StatusCode)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream generation went on after the client left")
	}
	h.settled()
	var src string
	if err := h.db.Get(&src, "SELECT settle_source FROM run_holds WHERE user_id = ? ORDER BY created_at DESC LIMIT 1", u.ID); err != nil || src != "cancel" {
		t.Errorf("non-stream run settled %q (%v), want cancel", src, err)
	}
}

// TestIdempotentReplayKeepsTheAnswersHeaders: DESIGN §6 — a finished Idempotency-Key request
// is answered again from "the stored response (status, headers, body)": the provider's headers
// the first answer carried (a request id a caller quotes to its provider) come back too.
func TestIdempotentReplayKeepsTheAnswersHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req_upstream_42")
		w.Header().Set("Openai-Processing-Ms", "17")
		_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`))
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *configT) { c.Upstreams[0].BaseURL = up.URL })
	_, key := h.user("standard")
	hdr := map[string]string{proxy.IdempotencyKeyHeader: "replay-headers-1"}
	first := h.post(key, "/v1/chat/completions", chatBody, hdr)
	fb := readAll(t, first.Body)
	first.Body.Close()
	h.settled()
	again := h.post(key, "/v1/chat/completions", chatBody, hdr)
	ab := readAll(t, again.Body)
	again.Body.Close()
	if first.StatusCode != 200 || again.StatusCode != 200 || string(fb) != string(ab) || again.Header.Get(proxy.ReplayedHeader) != "true" {
		t.Fatalf("first %d %s, replay %d %s (%v)", first.StatusCode, fb, again.StatusCode, ab, again.Header)
	}
	for _, k := range []string{"X-Request-Id", "Openai-Processing-Ms"} {
		if got, want := again.Header.Get(k), first.Header.Get(k); got != want {
			t.Errorf("replay's %s = %q, the first answer had %q", k, got, want)
		}
	}
}

// TestHoldTierIsThePlanInForce: the tier's threshold (heavy_after_turns) came from the plan in
// the process's key cache, the tier's amounts from the plan the admission read under the user
// lock: for up to key_cache_ttl after a plan change, a call was held by the new plan's tiers at
// the old plan's threshold. Both are the plan the admission reads now.
func TestHoldTierIsThePlanInForce(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Limits.KeyCacheTTL = time.Minute
		g := c.Plans["guest"]
		g.HeavyAfterTurns = 2
		c.Plans["guest"] = g
	})
	u, key := h.user("standard") // heavy from 4 user turns
	body := `{"model":"fake-gpt","max_tokens":5,"messages":[{"role":"user","content":"one"},` +
		`{"role":"assistant","content":"answer"},{"role":"user","content":"two"}]}`
	first := h.post(key, "/v1/chat/completions", body, nil) // caches the key with its plan
	readAll(t, first.Body)
	first.Body.Close()
	if r := h.run(u.ID, first.Header.Get(proxy.RunIDHeader)); r.HeldMicro != 20_000 {
		t.Fatalf("2 user turns on standard: held %d, want the normal tier 20000", r.HeldMicro)
	}
	if err := h.store.ChangeUser(context.Background(), u.ID, holds.UserChange{Plan: "guest"}); err != nil {
		t.Fatal(err)
	}
	cached := h.keyStaysCached()
	resp := h.post(key, "/v1/chat/completions", strings.Replace(body, "two", "two again", 1), nil)
	b := readAll(t, resp.Body)
	resp.Body.Close()
	cached("the call after the plan change")
	if resp.StatusCode != 200 {
		t.Fatalf("after the change: %d %s", resp.StatusCode, b)
	}
	if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.HeldMicro != 60_000 {
		t.Errorf("2 user turns on guest (heavy from 2): held %d, want the heavy tier 60000", r.HeldMicro)
	}
}
