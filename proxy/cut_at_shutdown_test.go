package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestCallsCutAtTheDrainDeadlineAreToldSo: the calls still running when a graceful shutdown's
// drain deadline passes are cut (CutCalls) while their callers are still there. A call not
// answered yet gets 503 shutting_down with Retry-After (an SDK retries it, on another instance);
// a stream under way ends with a shutting_down error event in its own format and a clean end
// of its body. Each is settled by what it used, as source "shutdown". They were cut by closing
// their connections alone: an empty reply, which an SDK retries as a connection error without
// being told why, and a stream stopped mid-answer with no error event.
func TestCallsCutAtTheDrainDeadlineAreToldSo(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")

	type ended struct {
		status int
		header http.Header
		body   string
		err    error
	}
	// Not cut, each call would run for minutes: the client's bound ends the test instead.
	client := &http.Client{Timeout: 15 * time.Second}
	send := func(path, body string, hdr map[string]string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, h.gw.URL+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return client.Do(req)
	}
	// A call answered whole, whose upstream takes an hour to answer.
	whole := make(chan ended, 1)
	go func() {
		resp, err := send("/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"slow answer"}]}`,
			map[string]string{fakellm.HeaderLatency: "1h"})
		if err != nil {
			whole <- ended{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		whole <- ended{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	}()
	// Two streams under way, in the chat and the Anthropic formats, that would run for minutes.
	type stream struct {
		runID string
		rd    *bufio.Reader
		body  io.Closer
	}
	var streams []stream
	for _, s := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"long story"}]}`},
		{"/v1/messages", `{"model":"claude-test","max_tokens":50000,"stream":true,"messages":[{"role":"user","content":"long story"}]}`},
	} {
		resp, err := send(s.path, s.body, map[string]string{fakellm.HeaderChunks: "10000", fakellm.HeaderChunkInterval: "20ms"})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", s.path, resp.StatusCode)
		}
		rd := bufio.NewReader(resp.Body)
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, stream{runID: resp.Header.Get(proxy.RunIDHeader), rd: rd, body: resp.Body})
	}
	waitFor(t, "the three calls sent upstream", func() bool { return h.fake.Calls() == 3 })

	h.srv.CutCalls()

	w := <-whole
	// Charged what it used: an SDK's retry, on another instance, would be charged again.
	if w.err != nil || w.status != http.StatusServiceUnavailable || w.header.Get("Retry-After") != "" ||
		w.header.Get("X-Should-Retry") != "false" || errorCode(t, []byte(w.body)) != "shutting_down" {
		t.Errorf("call answered whole, cut: %d %q (Retry-After %q, X-Should-Retry %q, err %v); want 503 shutting_down, not to be retried",
			w.status, w.body, w.header.Get("Retry-After"), w.header.Get("X-Should-Retry"), w.err)
	}
	// Its words agree with its headers: an agent reading it is not told to retry as if free.
	if !strings.Contains(w.body, "a retry is run and charged again") {
		t.Errorf("cut call's message %q: want it to say a retry is run and charged again", w.body)
	}
	if run := h.run(u.ID, w.header.Get(proxy.RunIDHeader)); run.SettleSource.String != holds.SourceShutdown || run.ChargedMicro <= 0 {
		t.Errorf("call answered whole, cut: settled by %q at %d; want shutdown, at its prompt's estimate", run.SettleSource.String, run.ChargedMicro)
	}
	for _, s := range streams {
		rest, err := io.ReadAll(s.rd)
		tail := string(rest[max(0, len(rest)-400):])
		if err != nil || !strings.Contains(tail, `"code":"shutting_down"`) || !strings.Contains(tail, "charged what it used") || strings.Contains(tail, "[DONE]") {
			t.Errorf("stream %s, cut: ended with %v after ...%s; want a shutting_down error event saying it is charged what it used, and a clean end", s.runID, err, tail)
		}
		if run := h.run(u.ID, s.runID); run.SettleSource.String != holds.SourceShutdown || run.OutTok <= 0 {
			t.Errorf("stream %s, cut: settled by %q with %d output tokens; want shutdown, with what it streamed", s.runID, run.SettleSource.String, run.OutTok)
		}
	}
}

// TestCallCutDuringItsAdmissionIsToldAndLoggedSo: calls whose admission waits on the user's row
// (held by an operator's console) when the drain deadline cuts them — a plain call, and a
// named run's, whose budget reservation also reads the cut context — are answered 503
// shutting_down, nothing held, and their log line says so: it said client_closed_request, 499,
// "client left", for a caller that was still there and told otherwise. Both the answer and the
// line say nothing is charged: they said it was charged what it used and that a retry is
// charged again, of a call never forwarded.
func TestCallCutDuringItsAdmissionIsToldAndLoggedSo(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	lock := testenv.ConsoleTx(t, h.db)
	var id uint64
	if err := lock.Get(&id, "SELECT id FROM users WHERE id = ? FOR UPDATE", u.ID); err != nil {
		t.Fatal(err)
	}
	answers := make(chan answer, 2)
	for _, hdr := range []map[string]string{nil, {"X-Run-Id": "job-cut"}} {
		go func() { answers <- send(h.gw.URL, key, chatBody, hdr) }()
	}
	waitFor(t, "both admissions waiting on the user's row", func() bool {
		var n int
		err := h.db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()
			AND ID <> CONNECTION_ID() AND INFO LIKE '%FROM users WHERE id IN%FOR UPDATE%' AND INFO NOT LIKE '%PROCESSLIST%'`)
		return err == nil && n > 0
	})
	h.srv.CutCalls()
	for range 2 {
		a := <-answers
		if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "shutting_down" || !toldNothingCharged(string(a.body)) {
			t.Errorf("call cut during its admission: %d %s, want 503 shutting_down, nothing charged", a.status, a.body)
		}
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	h.settled()
	// What the cut leaves the reconciler, were the admission's COMMIT to land unanswered (markLost):
	// the plain call's admission marked refused (released at 0, not charged what it held), the
	// named run's zero tally (settled at what its calls used), and no mark of the named run's.
	named := proxy.RunIDFor(u.ID, "job-cut")
	marks, err := h.rdb.Keys(context.Background(), h.keys.Prefix+"billing:refused:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(marks) != 1 || marks[0] == h.keys.Refused(named) {
		t.Errorf("refusal marks after the cut: %v; want one, the plain call's, none of the named run %s", marks, named)
	}
	if n, err := h.rdb.Exists(context.Background(), h.keys.Usage(named)).Result(); err != nil || n != 1 {
		t.Errorf("named run %s cut during its admission: zero tally found %d (%v); want it written", named, n, err)
	}
	refused := logs.FilterMessage("request refused").All()
	if len(refused) != 2 {
		t.Errorf("%d refusal lines, want one for each cut call", len(refused))
	}
	for _, l := range refused {
		f := l.ContextMap()
		if f["code"] != "shutting_down" || f["status"] != int64(http.StatusServiceUnavailable) || !strings.Contains(f["reason"].(string), "cut at the drain deadline") ||
			!toldNothingCharged(f["message"].(string)) {
			t.Errorf("refusal logged as %v %v %q %q, want shutting_down 503, cut at the drain deadline, nothing charged", f["code"], f["status"], f["reason"], f["message"])
		}
	}
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d holds live after the cut calls were refused", live)
	}
}

// toldNothingCharged reports whether msg, a cut call's answer or its line, says the call is
// charged nothing and speaks of no charge besides.
func toldNothingCharged(msg string) bool {
	return strings.Contains(msg, "nothing is charged") && strings.Count(msg, "charged") == 1
}
