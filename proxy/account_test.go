package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// keyStaysCached starts counting the process's key lookups; the func it returns fails the test
// unless every lookup since was answered from the key cache, and there was one. A test whose
// point is that the key was still cached checks it so, rather than trusting key_cache_ttl.
func (h *harness) keyStaysCached() (check func(what string)) {
	hits, misses := h.srv.CountKeyLookups()
	return func(what string) {
		h.t.Helper()
		if hits.Load() == 0 || misses.Load() != 0 {
			h.t.Fatalf("%s: %d key lookups answered from the cache, %d from the store; want the key still cached",
				what, hits.Load(), misses.Load())
		}
	}
}

func (h *harness) get(key, path string) (int, map[string]any) {
	h.t.Helper()
	return h.getDecoded(key, path, false)
}

// getExact is GET path with its numbers kept as the exact decimals the gateway sent.
func (h *harness) getExact(key, path string) (int, map[string]any) {
	h.t.Helper()
	return h.getDecoded(key, path, true)
}

func (h *harness) getDecoded(key, path string, exact bool) (int, map[string]any) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	if exact {
		dec.UseNumber()
	}
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		h.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, out
}

func TestCreditsShowExactDecimals(t *testing.T) {
	// used_today is read after the call settled: on the midday clock both are one day's.
	h := newHarnessMidday(t, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	got, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Body.Close()
	dec := json.NewDecoder(got.Body)
	dec.UseNumber() // the exact decimals as sent, not floats
	var c map[string]any
	if err := dec.Decode(&c); err != nil || got.StatusCode != 200 {
		t.Fatalf("credits: %d %v", got.StatusCode, err)
	}
	// The charge in micro-USD, shown in credits of 1000 micro-USD with every digit.
	used := pricing.FormatCredits(run.ChargedMicro, 1000)
	avail := pricing.FormatCredits(2_000_000-run.ChargedMicro, 1000)
	if run.ChargedMicro%1000 == 0 {
		t.Fatalf("charge %d µUSD is a whole number of credits: the test shows no decimals", run.ChargedMicro)
	}
	if c["allowance"] != json.Number("2000") || c["used_today"] != json.Number(used) || c["held"] != json.Number("0") ||
		c["available"] != json.Number(avail) {
		t.Fatalf("credits = %v, want used_today %s and available %s exactly", c, used, avail)
	}
}

// TestAUserSeesOnlyTheirOwnRuns: another user's run answers exactly like a run that does not
// exist, by its gateway id and by its X-Run-Id name.
func TestAUserSeesOnlyTheirOwnRuns(t *testing.T) {
	h := newHarness(t, nil)
	_, alice := h.user("standard")
	_, bob := h.user("standard")
	resp := h.post(alice, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "alice-task"})
	readAll(t, resp.Body)
	resp.Body.Close()
	runID := resp.Header.Get(proxy.RunIDHeader)
	if status, _ := h.get(alice, "/v1/runs/alice-task"); status != 200 {
		t.Fatalf("owner reading her run by name: %d", status)
	}
	_, missing := h.get(bob, "/v1/runs/no-such-run")
	for _, path := range []string{"/v1/runs/" + runID, "/v1/runs/alice-task"} {
		status, body := h.get(bob, path)
		if status != 404 || !jsonEqual(body, missing) {
			t.Fatalf("bob GET %s: %d %v, want the 404 of a missing run %v", path, status, body, missing)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/runs/alice-task/settle", nil)
	req.Header.Set("Authorization", "Bearer "+bob)
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 404 {
		t.Fatalf("bob settling alice's run: %d", r2.StatusCode)
	}
	if _, live := h.holdCount(); live != 1 {
		t.Fatalf("alice's run should still be open, %d live holds", live)
	}
	// Alice closes it.
	req, _ = http.NewRequest(http.MethodPost, h.gw.URL+"/v1/runs/alice-task/settle", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	r3, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r3.Body.Close()
	if _, live := h.holdCount(); r3.StatusCode != 200 || live != 0 {
		t.Fatalf("alice settling: %d, %d live holds", r3.StatusCode, live)
	}
}

func jsonEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestModelsListThePricedModels(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	status, body := h.get(key, "/v1/models")
	if status != 200 || body["object"] != "list" {
		t.Fatalf("GET /v1/models: %d %v", status, body)
	}
	var ids []string
	for _, m := range body["data"].([]any) {
		ids = append(ids, m.(map[string]any)["id"].(string))
	}
	if strings.Join(ids, ",") != "claude-test,fake-gpt" {
		t.Fatalf("models %v, want the priced models claude-test and fake-gpt", ids)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	h := newHarness(t, nil)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(h.gw.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
	// Readiness fails when Redis is gone: a gateway that cannot tally or dedupe should leave
	// the load balancer's rotation.
	h2 := newHarness(t, nil)
	h2.rdb.Close()
	resp, err := http.Get(h2.gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis closed: %d", resp.StatusCode)
	}
}

// TestModelWithoutAnUpstreamOnTheRouteIsRefusedBeforeAnyHold: fake-gpt is priced and served by
// the OpenAI-kind upstream, but no Anthropic-kind upstream serves it on /v1/messages.
func TestModelWithoutAnUpstreamOnTheRouteIsRefusedBeforeAnyHold(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/messages", `{"model":"fake-gpt","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || errorCode(t, body) != "model_not_served" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if all, _ := h.holdCount(); all != 0 || h.fake.Calls() != 0 {
		t.Fatalf("%d holds, %d upstream calls for a refused request", all, h.fake.Calls())
	}
}

// TestModelServedElsewhereOrNowhereIsRefusedBeforeAnyHold: README "Errors", 400
// model_not_served for the rest of its row: a priced model that no configured upstream serves,
// and an Anthropic upstream's model on an OpenAI route. Neither is held, forwarded or charged.
func TestModelServedElsewhereOrNowhereIsRefusedBeforeAnyHold(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"fake-*"} // the OpenAI upstream; the Anthropic one serves "claude*"
		c.Models["orphan-model"] = c.Models["fake-gpt"]
	})
	_, key := h.user("standard")
	for _, model := range []string{"claude-test", "orphan-model"} {
		resp := h.post(key, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "model_not_served" {
			t.Fatalf("%s: %d %s, want 400 model_not_served", model, resp.StatusCode, body)
		}
	}
	if all, _ := h.holdCount(); all != 0 || h.fake.Calls() != 0 {
		t.Fatalf("%d holds, %d upstream calls for refused requests", all, h.fake.Calls())
	}
}

// TestADisabledUserIsRefusedAtOnce: the key is still in the process cache, but admission reads
// the user's row under its lock and refuses.
func TestADisabledUserIsRefusedAtOnce(t *testing.T) {
	// The cache outlives the test, so the refusal can only come from the admission.
	h := newHarness(t, func(c *config.Config) { c.Limits.KeyCacheTTL = time.Minute })
	u, key := h.user("standard")
	h.postOK(t, key, "/v1/chat/completions", chatBody, nil) // before disabling
	if _, err := h.store.DisableUser(context.Background(), u.ID); err != nil {
		t.Fatal(err)
	}
	cached := h.keyStaysCached()
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"again"}]}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	cached("the call after disabling")
	if resp.StatusCode != 401 || errorCode(t, body) != "invalid_api_key" {
		t.Fatalf("after disabling: %d %s", resp.StatusCode, body)
	}
}

// TestCreditsNameThePlanTheirFiguresAreOf: the balance is read from the user's row, but the
// plan's name came from the key cache, as it was when the key was looked up: for up to
// key_cache_ttl after a plan change, /v1/credits named the old plan beside the new plan's
// allowance. Both now come from the same read.
func TestCreditsNameThePlanTheirFiguresAreOf(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.KeyCacheTTL = time.Minute })
	u, key := h.user("standard")
	if code, c := h.get(key, "/v1/credits"); code != 200 || c["plan"] != "standard" || c["allowance"] != 2000.0 {
		t.Fatalf("before the change: %d %v", code, c)
	}
	if err := h.store.ChangeUser(context.Background(), u.ID, holds.UserChange{Plan: "guest"}); err != nil {
		t.Fatal(err)
	}
	cached := h.keyStaysCached()
	code, c := h.get(key, "/v1/credits") // the key is still cached, with the plan it had
	cached("/v1/credits after the plan change")
	if code != 200 || c["plan"] != "guest" || c["allowance"] != 100.0 {
		t.Fatalf("after moving the user to guest: %d plan %v allowance %v, want guest and 100", code, c["plan"], c["allowance"])
	}
}

// TestCreditsNameThePlanInForce: a user whose row names a plan no longer configured gets the
// default plan's terms (the README's default_plan), but /v1/credits named the row's plan beside
// the default plan's allowance: a plan the caller cannot look up, whose terms are not the ones
// shown. It names the plan whose terms it shows.
func TestCreditsNameThePlanInForce(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("guest")
	if _, err := h.db.Exec("UPDATE users SET plan = 'gold' WHERE id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	code, c := h.get(key, "/v1/credits")
	if code != 200 || c["plan"] != h.cfg.DefaultPlan || c["allowance"] != 2000.0 {
		t.Fatalf("a user on an unconfigured plan: %d plan %v allowance %v, want the default plan %q and its 2000",
			code, c["plan"], c["allowance"], h.cfg.DefaultPlan)
	}
}
