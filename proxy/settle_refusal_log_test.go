package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// TestSettleRefusedForRedisLogsASampledRefusal: a POST /v1/runs/{id}/settle that Redis cannot
// serve (the run's tally unreadable) is refused 503 with nothing done, as a call refused for
// Redis is — but it wrote an ERROR line, and ERROR lines are never sampled: while Redis was
// out, a caller settling in a loop wrote a line per request at its own rate, however fast.
// It writes the refusal's one line now, "request refused" at WARN with its status and code,
// which the logger samples like every other refusal of the gateway's failures.
func TestSettleRefusedForRedisLogsASampledRefusal(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")
	h.postOK(t, key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "settle-in-outage"})
	h.settled()

	// A second gateway on the same stores whose tally Redis does not answer.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { dead.Close() })
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys,
		Tally: runstate.NewTally(dead, h.keys, h.cfg.Holds.TallyTTL), Leases: h.leases, Log: zap.New(core)})
	gw := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.WaitSettlements(ctx)
		_ = srv.Close()
	})
	logs.TakeAll()
	const settles = 5
	for range settles {
		req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/runs/settle-in-outage/settle", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" {
			t.Fatalf("settle with the tally unreadable: %d %s, want 503 billing_unavailable", resp.StatusCode, body)
		}
	}
	lines := logs.TakeAll()
	refusals := 0
	for _, l := range lines {
		if l.Level >= zapcore.ErrorLevel {
			t.Errorf("settle refused for Redis wrote an unsampled %s line %q", l.Level, l.Message)
		}
		if l.Message == "request refused" && l.Level == zapcore.WarnLevel {
			f := l.ContextMap()
			if f["status"] != int64(http.StatusServiceUnavailable) || f["code"] != "billing_unavailable" || f["run_id"] == nil {
				t.Errorf("refusal logged status %v code %v run %v", f["status"], f["code"], f["run_id"])
			}
			refusals++
		}
	}
	if refusals != settles {
		t.Errorf("%d 'request refused' WARN lines for %d refused settles, want one each", refusals, settles)
	}
	// The run is untouched: settled on the main gateway as if nothing had happened.
	if status, body := h.settleRun(key, "settle-in-outage"); status != http.StatusOK {
		t.Fatalf("settle once Redis answers: %d %s", status, body)
	}
}
