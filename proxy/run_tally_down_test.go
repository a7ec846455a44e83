package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// TestLiveRunWithoutItsTallyIsNotShown: GET /v1/runs/{id} of a live run whose tally Redis
// could not give answered 200 with the run's usage at zero and no tallied_cost, a run that
// read as having used nothing (the README said 503). It answers 503 billing_unavailable now;
// a settled run, whose charge is in the database, is still shown.
func TestLiveRunWithoutItsTallyIsNotShown(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	for _, name := range []string{"live-task", "done-task"} {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name})
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call of %s: %d", name, resp.StatusCode)
		}
	}
	if status, body := h.settleRun(key, "done-task"); status != http.StatusOK {
		t.Fatalf("settle done-task: %d %s", status, body)
	}
	if status, view := h.get(key, "/v1/runs/live-task"); status != http.StatusOK || view["tallied_cost"] == nil {
		t.Fatalf("live run with Redis up: %d %v, want 200 with its tallied_cost", status, view)
	}

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { dead.Close() })
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys, Leases: h.leases, Log: zap.NewNop(),
		Tally: runstate.NewTally(dead, h.keys, h.cfg.Holds.TallyTTL)})
	gw, own := httptest.NewServer(srv.Handler()), h.gw
	t.Cleanup(func() {
		h.gw = own // the harness closes its own gateway
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.WaitSettlements(ctx)
		_ = srv.Close()
	})
	h.gw = gw // h.get asks this gateway from here on
	status, view := h.get(key, "/v1/runs/live-task")
	e, _ := view["error"].(map[string]any)
	if code, _ := e["code"].(string); status != http.StatusServiceUnavailable || code != "billing_unavailable" {
		t.Errorf("live run with its tally unreadable: %d %v, want 503 billing_unavailable", status, view)
	}
	if status, view := h.get(key, "/v1/runs/done-task"); status != http.StatusOK || view["charged"] == nil {
		t.Errorf("settled run with Redis down: %d %v, want 200 with its charge", status, view)
	}
}
