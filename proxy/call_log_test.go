package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestCallLogNamesItsRunOnce: a call's log lines carry its run id, and one only. A named run's
// call (X-Run-Id) learns its run id after its first fields are set; its lines carried both the
// id made up on arrival and the run's, two "run_id" keys in one JSON object, which log
// pipelines read as either.
func TestCallLogNamesItsRunOnce(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-logged"}
	first := h.post(key, "/v1/chat/completions", chatBody, run)
	readAll(t, first.Body)
	first.Body.Close()
	if status, body := h.settleRun(key, "task-logged"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	late := h.post(key, "/v1/chat/completions", chatBody, run) // refused: the run is settled
	readAll(t, late.Body)
	late.Body.Close()
	if late.StatusCode != http.StatusConflict {
		t.Fatalf("call on the settled run: %d, want 409", late.StatusCode)
	}

	refused := logs.FilterMessage("request refused").All()
	if len(refused) != 1 {
		t.Fatalf("%d 'request refused' lines, want 1", len(refused))
	}
	var ids []string
	for _, f := range refused[0].Context {
		if f.Key == "run_id" {
			ids = append(ids, f.String)
		}
	}
	if want := first.Header.Get("X-Tollgate-Run-Id"); len(ids) != 1 || ids[0] != want {
		t.Fatalf("refused call logged run ids %q, want just %q", ids, want)
	}
}

// TestNamedRunCallRefusedForItsBodyLogsTheRun: an agent's call refused for its body (bad
// JSON) logged the id the request made up for itself as its run_id, so an operator searching
// the log by the agent's run did not find the refusal. It names the named run now.
func TestNamedRunCallRefusedForItsBodyLogsTheRun(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-bad-body"}
	first := h.post(key, "/v1/chat/completions", chatBody, run)
	readAll(t, first.Body)
	first.Body.Close()
	want := first.Header.Get("X-Tollgate-Run-Id")
	if first.StatusCode != http.StatusOK || want == "" {
		t.Fatalf("first call: %d, run %q", first.StatusCode, want)
	}
	logs.TakeAll()
	bad := h.post(key, "/v1/chat/completions", `{"model":`, run)
	readAll(t, bad.Body)
	bad.Body.Close()
	if bad.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad JSON: %d, want 400", bad.StatusCode)
	}
	refused := logs.FilterMessage("request refused").All()
	if len(refused) != 1 {
		t.Fatalf("%d 'request refused' lines, want 1", len(refused))
	}
	if got := refused[0].ContextMap()["run_id"]; got != want {
		t.Fatalf("refused call of run %s logged run_id %v", want, got)
	}
}

// TestEachRefusalLogsOneLineWithItsCodeStatusRunAndUser: a refused model call writes one line,
// "request refused", with the status, code and message the caller got, its run id and the caller's user
// id (when known), and never the caller's key. A wrong key wrote nothing (nor was counted in
// tollgate_requests_total); a duplicate check or an idempotency record Redis could not answer
// wrote an ERROR line beside the refusal's, or one without its status and code.
func TestEachRefusalLogsOneLineWithItsCodeStatusRunAndUser(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	broke, brokeKey := h.user("standard")
	var none int64
	if err := h.store.SetUserLimits(context.Background(), broke.ID, &none, nil, nil); err != nil {
		t.Fatal(err)
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { dead.Close() })
	deadDedup := observedGateway(h, zap.New(core), dead)

	for _, tc := range []struct {
		name, url, key, body string
		hdr                  map[string]string
		user                 uint64
		status               int
		code                 string
	}{
		{"wrong key", h.gw.URL, "sk-wrong-key-0123456789", chatBody, nil, 0, 401, "invalid_api_key"},
		{"bad JSON", h.gw.URL, key, `{"model":`, nil, u.ID, 400, "invalid_json"},
		{"nothing available", h.gw.URL, brokeKey, chatBody, nil, broke.ID, 402, "insufficient_credits"},
		{"duplicate check down", deadDedup, key, chatBody, nil, u.ID, 503, "dedup_unavailable"},
		{"idempotency record down", deadDedup, key, chatBody, map[string]string{"Idempotency-Key": "k-1"}, u.ID, 503, "dedup_unavailable"},
	} {
		h.settled()
		logs.TakeAll()
		a := send(tc.url, tc.key, tc.body, tc.hdr)
		if a.status != tc.status || errorCode(t, a.body) != tc.code {
			t.Fatalf("%s: %d %s, want %d %s", tc.name, a.status, a.body, tc.status, tc.code)
		}
		h.settled()
		lines := logs.TakeAll()
		if len(lines) != 1 || lines[0].Message != "request refused" {
			var msgs []string
			for _, l := range lines {
				msgs = append(msgs, l.Message)
			}
			t.Errorf("%s: lines %q, want one 'request refused'", tc.name, msgs)
			continue
		}
		f := lines[0].ContextMap()
		if f["status"] != int64(tc.status) || f["code"] != tc.code {
			t.Errorf("%s: logged status %v code %v, want %d %s", tc.name, f["status"], f["code"], tc.status, tc.code)
		}
		// What the caller was told, which says why (a body: which part).
		if want := errorMessage(t, a.body); f["message"] != want {
			t.Errorf("%s: logged message %q, want the caller's %q", tc.name, f["message"], want)
		}
		if tc.user != 0 && (f["user_id"] != tc.user || f["run_id"] == nil) {
			t.Errorf("%s: logged user %v run %v, want user %d and a run id", tc.name, f["user_id"], f["run_id"], tc.user)
		}
		for k, v := range f {
			if s, ok := v.(string); ok && strings.Contains(s, tc.key) {
				t.Errorf("%s: field %s carries the caller's key", tc.name, k)
			}
		}
	}
	if got := h.metric(`tollgate_requests_total{code="401",route="/v1/chat/completions"}`); got != "1" {
		t.Errorf("wrong-key refusals counted %q, want 1", got)
	}
}

// observedGateway is another gateway on the harness's stores that logs to log and keeps its
// duplicate detection in dedup.
func observedGateway(h *harness, log *zap.Logger, dedup redis.UniversalClient) string {
	h.t.Helper()
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys, Tally: h.tally, Leases: h.leases,
		Log: log, DedupRedis: dedup})
	gw := httptest.NewServer(srv.Handler())
	h.t.Cleanup(func() {
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.WaitSettlements(ctx); err != nil {
			h.t.Errorf("observed gateway settlements: %v", err)
		}
		_ = srv.Close()
	})
	return gw.URL
}

// TestLostIdempotentAdmissionLogNamesItsHold: an Idempotency-Key request's admission commits
// and its reply is lost, so its hold is released in the background. The money log's lines
// about that release must name the hold's run (the key's attempt), not the random id the
// request was given on arrival and never admitted under: an operator tracing an admit_lost
// row, or a release that failed and left a hold to the reconciler, found no line for it.
func TestLostIdempotentAdmissionLogNamesItsHold(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db, log: zap.New(core)}, func(c *config.Config) {
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
	})
	u, key := h.user("standard")
	postWithLostAdmission(h, lossy, key, map[string]string{proxy.IdempotencyKeyHeader: "lost-" + testenv.RandomID(4)})
	h.settled()
	var runID string
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	lines := logs.Filter(func(e observer.LoggedEntry) bool { return strings.Contains(e.Message, "admission") }).All()
	if len(lines) == 0 {
		t.Fatal("no log line about the lost admission")
	}
	for _, l := range lines {
		if got := l.ContextMap()["run_id"]; got != runID {
			t.Errorf("%q names run %v, want the hold's %s", l.Message, got, runID)
		}
	}
}

// errorMessage reads the OpenAI error shape and returns its message.
func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an OpenAI error shape: %s", body)
	}
	return e.Error.Message
}

// TestWrongKeyLogLineDoesNotQuoteAHugePath: a request refused for its key writes its path as
// the line's route. The routes a wrong key reaches take any path under /v1/models/ and any
// run id under /v1/runs/, so a caller with no key at all made the gateway write a line as long
// as the path it sent (up to the server's 64 KiB of header), a hundred of them a second before
// sampling: a log a stranger filled at 6 MB a second. Every string the line quotes is at most
// the 512 bytes the log quotes of anything a caller sent.
func TestWrongKeyLogLineDoesNotQuoteAHugePath(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	long := strings.Repeat("x", 60_000)
	for _, path := range []string{"/v1/models/" + long, "/v1/runs/" + long} {
		for _, key := range []string{"", "tg_wrong"} {
			logs.TakeAll()
			status, _ := h.get(key, path)
			if status != http.StatusUnauthorized {
				t.Fatalf("GET %.20s… with key %q: %d, want 401", path, key, status)
			}
			lines := logs.FilterMessage("request refused").TakeAll()
			if len(lines) != 1 {
				t.Fatalf("GET %.20s… with key %q: %d 'request refused' lines, want 1", path, key, len(lines))
			}
			for k, v := range lines[0].ContextMap() {
				if s, ok := v.(string); ok && len(s) > 512 {
					t.Errorf("GET %.20s… with key %q: field %s quotes %d bytes, want at most 512", path, key, k, len(s))
				}
			}
		}
	}
}

// TestNamedRunCallLinesCarryTheAskedName: a named run's call lines named the run by its hash
// (run_id, x_…) alone, so an operator told "run agent:42 failed" could not find them; the
// settle route logs the name as asked_id, and so do they now, before admission (a bad body)
// and after (a call on the settled run). A plain call's lines have none, and an invalid name,
// refused, is quoted bounded.
func TestNamedRunCallLinesCarryTheAskedName(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "agent:42"}
	refusedLine := func(body string, hdr map[string]string, status int) map[string]any {
		t.Helper()
		logs.TakeAll()
		resp := h.post(key, "/v1/chat/completions", body, hdr)
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Fatalf("%v: %d, want %d", hdr, resp.StatusCode, status)
		}
		refused := logs.FilterMessage("request refused").All()
		if len(refused) != 1 {
			t.Fatalf("%v: %d 'request refused' lines, want 1", hdr, len(refused))
		}
		return refused[0].ContextMap()
	}
	if f := refusedLine(`{"model":`, run, http.StatusBadRequest); f["asked_id"] != "agent:42" {
		t.Errorf("named run's call refused for its body logged asked_id %v, want agent:42", f["asked_id"])
	}
	first := h.post(key, "/v1/chat/completions", chatBody, run)
	readAll(t, first.Body)
	first.Body.Close()
	if status, body := h.settleRun(key, "agent:42"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if f := refusedLine(chatBody, run, http.StatusConflict); f["asked_id"] != "agent:42" || f["run_id"] != first.Header.Get("X-Tollgate-Run-Id") {
		t.Errorf("call on the settled run logged asked_id %v run_id %v, want agent:42 and its run", f["asked_id"], f["run_id"])
	}
	if f := refusedLine(`{"model":`, nil, http.StatusBadRequest); f["asked_id"] != nil {
		t.Errorf("plain call logged asked_id %v", f["asked_id"])
	}
	long := strings.Repeat("n", 4000)
	f := refusedLine(chatBody, map[string]string{"X-Run-Id": long}, http.StatusBadRequest)
	if asked, _ := f["asked_id"].(string); asked == "" || len(asked) > 512 {
		t.Errorf("invalid run name quoted %d bytes, want its start, at most 512", len(asked))
	}
}
