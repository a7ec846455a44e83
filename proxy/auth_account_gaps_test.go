package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestXAPIKeyIsAcceptedOnlyOnAnthropicRoutes: DESIGN §3's auth takes `x-api-key` on
// /v1/messages (and its token counter) only. Elsewhere a key in that header is no key: 401,
// no hold, no upstream call. Mutant: the path condition dropped, so x-api-key worked on every
// route.
func TestXAPIKeyIsAcceptedOnlyOnAnthropicRoutes(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	resp := h.post("", "/v1/chat/completions", chatBody, map[string]string{"x-api-key": key})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
		t.Fatalf("x-api-key on /v1/chat/completions: %d %s, want 401 invalid_api_key", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
	req.Header.Set("x-api-key", key)
	got, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got.Body.Close()
	if got.StatusCode != http.StatusUnauthorized {
		t.Fatalf("x-api-key on /v1/credits: %d, want 401", got.StatusCode)
	}
	if all, _ := h.holdCount(); all != 0 || h.fake.Calls() != 0 {
		t.Fatalf("%d holds, %d upstream calls for a request with no key", all, h.fake.Calls())
	}
}

// TestCreditsShowEveryFigureOfTheBalance: /v1/credits shows allowance, used today, held,
// prepaid, calls in flight and available = max(0, allowance - used today) + prepaid - held
// (DESIGN §2), each from its own field. The older test had nothing held and nothing prepaid,
// so mutants showing available as prepaid, or in_flight as 0, survived.
func TestCreditsShowEveryFigureOfTheBalance(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()
	if _, _, err := h.store.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: 5_500, IdempotencyKey: "pay-" + testenv.RandomID(4)}); err != nil {
		t.Fatal(err)
	}
	runID := "r_" + testenv.RandomID(16)
	if _, err := h.store.Admit(ctx, holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := h.store.Settle(ctx, holds.Settlement{RunID: runID, Source: holds.SourceComplete}); err != nil {
			t.Error(err)
		}
	}()
	held := h.run(u.ID, runID).HeldMicro
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber()
	var c map[string]any
	if err := dec.Decode(&c); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("credits: %d %v", resp.StatusCode, err)
	}
	cr := func(m int64) json.Number { return json.Number(pricing.FormatCredits(m, 1000)) }
	want := map[string]any{"allowance": cr(2_000_000), "used_today": cr(0), "held": cr(held), "prepaid": cr(5_500),
		"available": cr(2_000_000 + 5_500 - held), "in_flight": json.Number("1")}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("credits[%s] = %v, want %v (all: %v)", k, c[k], v, c)
		}
	}
}
