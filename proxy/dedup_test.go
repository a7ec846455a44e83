package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// The four forms of a duplicate from the seed (double submit, resend after the first
// finished, a script repeating itself, a redelivered run), and the machinery behind them:
// Idempotency-Key, X-Session-Id, the fingerprint window. Every test ends with the ledger
// check of the harness; each asserts one charged run per logical request and run_count.

// answer is one gateway response, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// send posts without touching t, so it can run on any goroutine.
func send(url, key, body string, hdr map[string]string) answer {
	return sendTo(url, "/v1/chat/completions", key, body, hdr)
}

// sendTo is send to another route than chat completions.
func sendTo(url, path, key, body string, hdr map[string]string) answer {
	return sendToCtx(context.Background(), url, path, key, body, hdr)
}

// sendOK is send for a step the test needs answered 200 before it goes on. label names
// the step (a case, a fixture, a turn) so a failure says which one failed. Unlike send it
// touches t: call it on the test's goroutine only.
func sendOK(t *testing.T, label, url, key, body string, hdr map[string]string) answer {
	t.Helper()
	return sendToOK(t, label, url, "/v1/chat/completions", key, body, hdr)
}

// sendToOK is sendOK to another route than chat completions.
func sendToOK(t *testing.T, label, url, path, key, body string, hdr map[string]string) answer {
	t.Helper()
	a := sendTo(url, path, key, body, hdr)
	if a.err != nil {
		t.Fatalf("%s: %d %s: %v, want 200", label, a.status, a.body, a.err)
	}
	if a.status != http.StatusOK {
		t.Fatalf("%s: %d %s, want 200", label, a.status, a.body)
	}
	return a
}

// sendToCtx is sendTo whose caller leaves when ctx ends.
func sendToCtx(ctx context.Context, url, path, key, body string, hdr map[string]string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// errorRunID reads the run id a duplicate-family error names.
func errorRunID(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			RunID string `json:"run_id"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.RunID == "" {
		t.Fatalf("no run_id in %s", body)
	}
	return e.Error.RunID
}

// holdsOf lists a user's holds once every settlement has finished.
func (h *harness) holdsOf(userID uint64) []holds.Run {
	h.t.Helper()
	h.settled()
	var ids []string
	if err := h.db.Select(&ids, "SELECT run_id FROM run_holds WHERE user_id = ? ORDER BY created_at", userID); err != nil {
		h.t.Fatal(err)
	}
	out := make([]holds.Run, 0, len(ids))
	for _, id := range ids {
		out = append(out, h.run(userID, id))
	}
	return out
}

// runCount is the user's run_count on the day ledger, summed over days.
func (h *harness) runCount(userID uint64) int64 {
	h.t.Helper()
	var n int64
	if err := h.db.Get(&n, "SELECT COALESCE(SUM(run_count), 0) FROM usage_days WHERE user_id = ?", userID); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// expectCharges asserts the user's holds: exactly the runs in charged were charged (each
// settled complete), every other hold is settled at zero with one of the allowed sources, and
// the ledger's run_count is len(charged).
func (h *harness) expectCharges(userID uint64, charged []string, zeroSources ...string) []holds.Run {
	h.t.Helper()
	all := h.holdsOf(userID)
	want := map[string]bool{}
	for _, id := range charged {
		want[id] = true
	}
	allowed := map[string]bool{}
	for _, s := range zeroSources {
		allowed[s] = true
	}
	for _, r := range all {
		switch {
		case r.State != holds.StateSettled:
			h.t.Errorf("run %s still %s", r.RunID, r.State)
		case want[r.RunID]:
			if r.ChargedMicro <= 0 {
				h.t.Errorf("run %s: charged %d, want a charge", r.RunID, r.ChargedMicro)
			}
			delete(want, r.RunID)
		case r.ChargedMicro != 0 || !allowed[r.SettleSource.String]:
			h.t.Errorf("run %s: charged %d source %q, want 0 from %v", r.RunID, r.ChargedMicro, r.SettleSource.String, zeroSources)
		}
	}
	for id := range want {
		h.t.Errorf("run %s: no hold", id)
	}
	if n := h.runCount(userID); n != int64(len(charged)) {
		h.t.Errorf("run_count %d, want %d", n, len(charged))
	}
	return all
}

// waitLive polls until the user has n live holds.
func (h *harness) waitLive(userID uint64, n int) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live int
		if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state <> 'settled'", userID); err != nil {
			h.t.Fatal(err)
		}
		if live == n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d live holds, want %d", live, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitUpstream polls until fakellm has received n calls: a call reaches the upstream only after
// its duplicate registration (fingerprint, session claim), so a request sent after this is
// surely the second to register. A live hold alone is not enough: the hold comes first.
func (h *harness) waitUpstream(n int64) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.fake.Calls() < n {
		if time.Now().After(deadline) {
			h.t.Fatalf("upstream saw %d calls, want %d", h.fake.Calls(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// secondGateway is another gateway process on the same MySQL and Redis (its own settlements,
// its own cancel subscription), optionally with its own Redis for duplicate detection.
func (h *harness) secondGateway(dedup redis.UniversalClient, mutate func(*config.Config)) (*proxy.Server, string) {
	h.t.Helper()
	cfg := *h.cfg
	if mutate != nil {
		mutate(&cfg)
	}
	log := zaptest.NewLogger(h.t, zaptest.Level(zap.WarnLevel))
	leases := runstate.NewLeases(h.gwRDB, h.keys, "test-2", cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, log)
	srv := proxy.New(proxy.Deps{Config: &cfg, Store: h.store, Redis: h.gwRDB, Keys: h.keys, Tally: h.tally, Leases: leases,
		Log: log, DedupRedis: dedup})
	gw := httptest.NewServer(srv.Handler())
	// Registered after the harness's cleanup, so it runs first: this gateway's settlements are
	// done before the ledger check.
	h.t.Cleanup(func() {
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.WaitSettlements(ctx); err != nil {
			h.t.Errorf("second gateway settlements: %v", err)
		}
		_ = srv.Close()
	})
	return srv, gw.URL
}

// TestDuplicateHoldIsGoneWhenItsAnswerArrives: a request found to duplicate a running one
// releases its fresh hold in the request itself, so by the time the caller reads its 409 the
// only live hold is the original's — checked at that moment, not after waiting.
func TestDuplicateHoldIsGoneWhenItsAnswerArrives(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	// The original stays mid-stream until the resend is answered (gateUpstream's held stream).
	orig := h.post(key, "/v1/chat/completions", streamBody, with(slowStream(20, nil), "X-Test-Hold-Stream", "orig"))
	defer orig.Body.Close()
	var opened sync.Once
	openOrig := func() { opened.Do(func() { gate.open("orig") }) }
	defer openOrig()
	br := firstEvent(t, orig)
	dup := h.post(key, "/v1/chat/completions", streamBody, nil)
	body := readAll(t, dup.Body)
	dup.Body.Close()
	if dup.StatusCode != http.StatusConflict || errorCode(t, body) != "duplicate" {
		t.Fatalf("resend while the original runs: %d %s, want 409 duplicate", dup.StatusCode, body)
	}
	var live int
	if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state <> 'settled'", u.ID); err != nil {
		t.Fatal(err)
	}
	if live != 1 {
		t.Fatalf("%d live holds when the 409 arrived, want only the original's", live)
	}
	openOrig()
	readAll(t, br)
}

// TestSessionCallSupersededAfterItsAnswerIsWhole: a newer message of the session arrives
// after the running call's final event but before its upstream closed. That call's answer was
// whole: it ends without a superseded error event and is charged as complete.
func TestSessionCallSupersededAfterItsAnswerIsWhole(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first := h.post(key, "/v1/chat/completions", streamBody, map[string]string{proxy.SessionHeader: "chat-done",
		fakellm.HeaderChunks: "5", fakellm.HeaderLinger: "2s"})
	defer first.Body.Close()
	br := bufio.NewReader(first.Body)
	toDone(t, br)
	sendOK(t, "the session's next message", h.gw.URL, key, chatBody, map[string]string{proxy.SessionHeader: "chat-done"})
	rest := readAll(t, br)
	if bytes.Contains(rest, []byte("superseded")) {
		t.Fatalf("a whole answer was followed by %q", rest)
	}
	if r := h.run(u.ID, first.Header.Get(proxy.RunIDHeader)); r.SettleSource.String != holds.SourceComplete || r.OutTok != 5 {
		t.Fatalf("first run %+v: want complete with its 5 output tokens", r)
	}
}

// TestFingerprintWhoseReplyWasLostIsNotItsOwnDuplicate: the SET NX that registers a request's
// fingerprint reaches Redis, its reply is lost with the connection, and the client sends it
// again, which now finds the key taken — by this very request. The request runs; it is not
// told it duplicates itself.
func TestFingerprintWhoseReplyWasLostIsNotItsOwnDuplicate(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	lose := &replyLoser{marker: []byte("dedup:")}
	opt := *h.rdb.Options()
	opt.Dialer, opt.MaxRetries = lose.dial, 3
	dedup := redis.NewClient(&opt)
	t.Cleanup(func() { dedup.Close() })
	_, url := h.secondGateway(dedup, nil)

	a := send(url, key, chatBody, nil)
	lose.ranAndLost(t)
	if a.status != http.StatusOK {
		t.Fatalf("request whose fingerprint reply was lost: %d %s, want 200", a.status, a.body)
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

// replyLoser sends the first write that contains marker, waits for Redis's reply to it (proof
// that Redis ran it: no sleep hoping it has) and then closes the connection, so the command
// runs and its reply is lost. One made with disarmedReplyLoser loses nothing until arm: the
// marked command may run before the moment a test stages. meanwhile, if set, runs after Redis
// has run the marked command and before its reply is lost: what another process did between
// the command and its resend.
type replyLoser struct {
	marker    []byte
	meanwhile func()
	disarmed  atomic.Bool
	lost      atomic.Bool
	mu        sync.Mutex
	err       error // the reply never came: the command may not have run
}

// disarmedReplyLoser is a replyLoser for marker that loses nothing until arm.
func disarmedReplyLoser(marker string) *replyLoser {
	l := &replyLoser{marker: []byte(marker)}
	l.disarmed.Store(true)
	return l
}

// arm makes the next write that contains the marker lose its reply.
func (l *replyLoser) arm() { l.disarmed.Store(false) }

func (l *replyLoser) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return wrappedDialer(func(c net.Conn) net.Conn { return &replyLosingConn{Conn: c, l: l} })(ctx, network, addr)
}

// ranAndLost fails the test unless the marked command was sent, run, and its reply lost.
func (l *replyLoser) ranAndLost(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.lost.Load() {
		t.Fatal("the marked command's reply was never lost: the test did not test anything")
	}
	if l.err != nil {
		t.Fatalf("no reply from Redis to the marked command: %v", l.err)
	}
}

type replyLosingConn struct {
	net.Conn
	l *replyLoser
}

func (c *replyLosingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil && !c.l.disarmed.Load() && bytes.Contains(b, c.l.marker) && c.l.lost.CompareAndSwap(false, true) {
		// The client reads only after its write returns: the reply's first bytes, read here,
		// are Redis's word that it ran the command. Then they are lost with the connection.
		_ = c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, rerr := c.Conn.Read(make([]byte, 1))
		c.l.mu.Lock()
		c.l.err = rerr
		c.l.mu.Unlock()
		if rerr == nil && c.l.meanwhile != nil {
			c.l.meanwhile()
		}
		c.Conn.Close()
	}
	return n, err
}

func waitSettlements(t *testing.T, srv *proxy.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.WaitSettlements(ctx); err != nil {
		t.Fatalf("settlements did not finish: %v", err)
	}
}

// A double click: the same body twice, 50 ms apart, no key, no session. The fingerprint
// window runs one; the other is a 409 duplicate naming it, its hold released at 0.
func TestDoubleSubmit50msApartRunsOnce(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	// The call that runs stays with the upstream until the other is answered (a fixed second
	// could pass before a slow machine's second click was checked).
	hdr := map[string]string{"X-Test-Gate": "click"}
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	answered := make(chan struct{}, len(answers))
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = send(h.gw.URL, key, chatBody, hdr)
			answered <- struct{}{}
		}()
		if i == 0 {
			time.Sleep(50 * time.Millisecond) // the scenario: a second click 50 ms later
		}
	}
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		// A watchdog, not a measure: both ran and wait at the gate; let them end and fail below.
	}
	gate.open("click")
	wg.Wait()
	var ran, dup *answer
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil:
			t.Fatal(a.err)
		case a.status == 200:
			ran = a
		case a.status == 409:
			dup = a
		}
	}
	if ran == nil || dup == nil {
		t.Fatalf("statuses %d and %d, want one 200 and one 409", answers[0].status, answers[1].status)
	}
	if code := errorCode(t, dup.body); code != "duplicate" {
		t.Fatalf("duplicate answered %q", code)
	}
	if dup.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("a duplicate must tell SDKs not to retry it")
	}
	runID := ran.header.Get(proxy.RunIDHeader)
	if got := errorRunID(t, dup.body); got != runID {
		t.Fatalf("duplicate names run %s, want %s", got, runID)
	}
	h.expectCharges(u.ID, []string{runID}, holds.SourceDuplicate)
	if n := gate.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

// A script that sends the same body five times within the window while the first still
// runs: one run, four duplicates. Once the first has ended, the same body is a new request.
func TestScriptRepeatingTheSameBodyFiveTimesRunsOnce(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	// The first stays with the upstream until the four repeats are answered: held a fixed 2 s
	// instead, it could end before a slow machine's fourth repeat, each an admission and its
	// release, was checked (run, not a duplicate).
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, chatBody, map[string]string{"X-Test-Gate": "first"}) }()
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	gate.await(t, "first", 1)
	var dupOf []string
	for range 4 {
		a := send(h.gw.URL, key, chatBody, nil)
		if a.err != nil || a.status != 409 {
			t.Fatalf("repeat: %d %s %v", a.status, a.body, a.err)
		}
		if code := errorCode(t, a.body); code != "duplicate" {
			t.Fatalf("repeat answered %q", code)
		}
		dupOf = append(dupOf, errorRunID(t, a.body))
	}
	openFirst()
	a := <-first
	if a.err != nil || a.status != 200 {
		t.Fatalf("first: %d %s %v", a.status, a.body, a.err)
	}
	runID := a.header.Get(proxy.RunIDHeader)
	for _, id := range dupOf {
		if id != runID {
			t.Fatalf("duplicate names %s, want %s", id, runID)
		}
	}
	all := h.expectCharges(u.ID, []string{runID}, holds.SourceDuplicate)
	if len(all) != 5 {
		t.Fatalf("%d holds, want 5 (each repeat held, then released)", len(all))
	}
	if n := gate.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}

	// The first has ended: asking again within the window is a new request, and runs.
	b := sendOK(t, "after the first ended", h.gw.URL, key, chatBody, nil)
	h.expectCharges(u.ID, []string{runID, b.header.Get(proxy.RunIDHeader)}, holds.SourceDuplicate)
	if got := h.metric(`tollgate_duplicates_total{answer="duplicate"}`); got != "4" {
		t.Fatalf("duplicates metric = %q, want 4", got)
	}
}

// A resend after the first finished, with the same Idempotency-Key: the stored answer comes
// back byte for byte (streams too), marked as a replay, and nothing is charged again.
func TestResendAfterFirstFinishedIsReplayed(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	stream := `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"count to ten"}]}`
	var charged []string
	for _, tc := range []struct{ name, body string }{{"non-streamed", chatBody}, {"streamed", stream}} {
		hdr := map[string]string{"Idempotency-Key": "resend-" + tc.name, fakellm.HeaderChunks: "12"}
		a := send(h.gw.URL, key, tc.body, hdr)
		if a.err != nil || a.status != 200 || a.header.Get(proxy.ReplayedHeader) != "" {
			t.Fatalf("%s first: %d %s %v", tc.name, a.status, a.body, a.err)
		}
		h.settled()
		b := send(h.gw.URL, key, tc.body, hdr)
		if b.err != nil || b.status != 200 || b.header.Get(proxy.ReplayedHeader) != "true" {
			t.Fatalf("%s resend: %d %v %s %v", tc.name, b.status, b.header, b.body, b.err)
		}
		if !bytes.Equal(a.body, b.body) || a.header.Get("Content-Type") != b.header.Get("Content-Type") {
			t.Fatalf("%s replay differs:\n%s\n%s", tc.name, a.body, b.body)
		}
		runID := a.header.Get(proxy.RunIDHeader)
		if b.header.Get(proxy.RunIDHeader) != runID {
			t.Fatalf("%s replay names run %s, want %s", tc.name, b.header.Get(proxy.RunIDHeader), runID)
		}
		charged = append(charged, runID)
		// The same key with another body is a mistake, not a retry.
		c := send(h.gw.URL, key, strings.Replace(tc.body, "fake-gpt", "fake-gpt-2024", 1), hdr)
		if c.status != 422 || errorCode(t, c.body) != "idempotency_key_reused" {
			t.Fatalf("%s other body: %d %s", tc.name, c.status, c.body)
		}
	}
	all := h.expectCharges(u.ID, charged)
	if len(all) != 2 {
		t.Fatalf("%d holds, want 2: a replay takes no hold", len(all))
	}
	if n := h.fake.Calls(); n != 2 {
		t.Fatalf("%d upstream calls, want 2", n)
	}
}

// Fifty requests with one Idempotency-Key at once make one upstream call. The rest are told
// the request is in progress (and to retry) or get the replay; retried, all get one answer.
func TestFiftyConcurrentRequestsWithOneKeyCallUpstreamOnce(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	hdr := map[string]string{"Idempotency-Key": "storm-1", fakellm.HeaderLatency: "300ms"}
	answers := make([]answer, 50)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() { defer wg.Done(); <-start; answers[i] = send(h.gw.URL, key, chatBody, hdr) }()
	}
	close(start)
	wg.Wait()
	var body []byte
	var runID string
	pending := 0
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Fatal(a.err)
		case a.status == 200:
			if body == nil {
				body, runID = a.body, a.header.Get(proxy.RunIDHeader)
			} else if !bytes.Equal(body, a.body) {
				t.Fatalf("two different answers:\n%s\n%s", body, a.body)
			}
		case a.status == 409:
			if code := errorCode(t, a.body); code != "request_in_progress" || a.header.Get("X-Should-Retry") != "true" ||
				a.header.Get("Retry-After") == "" {
				t.Fatalf("409 %s %v", a.body, a.header)
			}
			pending++
		default:
			t.Fatalf("status %d: %s", a.status, a.body)
		}
	}
	// Retry those that were told to, as an SDK would, until each has the answer.
	deadline := time.Now().Add(15 * time.Second)
	for pending > 0 {
		a := send(h.gw.URL, key, chatBody, hdr)
		switch {
		case a.status == 200:
			if body != nil && !bytes.Equal(body, a.body) {
				t.Fatalf("two different answers:\n%s\n%s", body, a.body)
			}
			body, runID = a.body, a.header.Get(proxy.RunIDHeader)
			pending--
		case a.status != 409 || time.Now().After(deadline):
			t.Fatalf("retry: %d %s %v", a.status, a.body, a.err)
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
	if all := h.expectCharges(u.ID, []string{runID}); len(all) != 1 {
		t.Fatalf("%d holds, want 1", len(all))
	}
}

// An attempt that failed before the upstream produced anything does not pin the key: the
// retry runs (a new attempt, a new run id) and is the one replayed afterwards.
func TestIdempotentRetryAfterUpstreamFailureRuns(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	a := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": "flaky", fakellm.HeaderStatus: "500"})
	if a.status != 502 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	h.settled()
	b := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": "flaky"})
	if b.status != 200 || b.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("retry: %d %s", b.status, b.body)
	}
	h.settled()
	c := send(h.gw.URL, key, chatBody, map[string]string{"Idempotency-Key": "flaky"})
	if c.status != 200 || c.header.Get(proxy.ReplayedHeader) != "true" || !bytes.Equal(b.body, c.body) {
		t.Fatalf("second retry: %d %v %s", c.status, c.header, c.body)
	}
	runID := b.header.Get(proxy.RunIDHeader)
	if all := h.expectCharges(u.ID, []string{runID}, holds.SourceUpstreamError); len(all) != 2 {
		t.Fatalf("%d holds, want 2 (the failed attempt and the one that ran)", len(all))
	}
}

// TestIdempotentAnswerIsNeverReplayedToAnotherBody: when the record of the body a key was
// first used with is missing (its write at the start failed), the stored answer still names
// its body, so a different body under the key gets 422, not the other body's answer.
func TestIdempotentAnswerIsNeverReplayedToAnotherBody(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "body-lost"}
	// The call stays mid-stream until its record is changed (gateUpstream's held stream).
	resp := h.post(key, "/v1/chat/completions", streamBody, with(slowStream(10, idem), "X-Test-Hold-Stream", "call"))
	var opened sync.Once
	openCall := func() { opened.Do(func() { gate.open("call") }) }
	defer openCall()
	br := firstEvent(t, resp)
	// As if the record's start had not reached Redis: no body on it while the call runs.
	ctx := context.Background()
	recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("idempotency records %v, %v; want one", recs, err)
	}
	if err := h.rdb.HDel(ctx, recs[0], "body").Err(); err != nil {
		t.Fatal(err)
	}
	openCall()
	readAll(t, br)
	resp.Body.Close()
	h.settled()
	other := send(h.gw.URL, key, chatBody, idem)
	if other.status != http.StatusUnprocessableEntity || other.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("a different body under the key: %d replayed=%q %s, want 422", other.status, other.header.Get(proxy.ReplayedHeader), other.body)
	}
}

// An answer larger than max_replay_len is not kept: a later request with its key gets 409
// naming the run, and is not run again.
func TestIdempotentAnswerTooLargeToReplay(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.MaxReplayLen = 64 })
	u, key := h.user("standard")
	hdr := map[string]string{"Idempotency-Key": "big"}
	a := sendOK(t, "first", h.gw.URL, key, chatBody, hdr)
	h.settled()
	b := send(h.gw.URL, key, chatBody, hdr)
	runID := a.header.Get(proxy.RunIDHeader)
	if b.status != 409 || errorCode(t, b.body) != "idempotent_response_too_large" || errorRunID(t, b.body) != runID {
		t.Fatalf("resend: %d %s", b.status, b.body)
	}
	h.expectCharges(u.ID, []string{runID})
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

// The same run admitted twice, as a queue redelivery or a crash takeover would: one hold,
// and of two settlements only the first charges.
func TestSameRunAdmittedTwiceHoldsAndChargesOnce(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()

	t.Run("store", func(t *testing.T) {
		ar := holds.AdmitRequest{RunID: "r_redelivered_task_0001", UserID: u.ID, Model: "fake-gpt", State: holds.StateQueued, TTL: time.Minute}
		first, err := h.store.Admit(ctx, ar)
		if err != nil || first.Existing {
			t.Fatalf("first admit: %+v %v", first, err)
		}
		again, err := h.store.Admit(ctx, ar)
		if err != nil || !again.Existing || again.HeldMicro != first.HeldMicro {
			t.Fatalf("redelivered admit: %+v %v", again, err)
		}
		for i, want := range []bool{true, false} {
			res, err := h.store.Settle(ctx, holds.Settlement{RunID: ar.RunID, CostMicro: 4321, Calls: 1, Source: holds.SourceComplete})
			if err != nil || res.Applied != want {
				t.Fatalf("settlement %d: %+v %v", i, res, err)
			}
		}
		if _, err := h.store.Admit(ctx, ar); err == nil {
			t.Fatal("a settled run was admitted again")
		}
	})

	t.Run("X-Run-Id", func(t *testing.T) {
		hdr := map[string]string{"X-Run-Id": "queue-task-7"}
		sendOK(t, "call", h.gw.URL, key, chatBody, hdr)
		for range 2 { // the settle request delivered twice
			if r := h.post(key, "/v1/runs/queue-task-7/settle", "", nil); r.StatusCode != 200 {
				t.Fatalf("settle: %d", r.StatusCode)
			} else {
				r.Body.Close()
			}
		}
		// Redelivered after it settled: refused, not run again.
		if a := send(h.gw.URL, key, chatBody, hdr); a.status != 409 || errorCode(t, a.body) != "run_settled" {
			t.Fatalf("redelivery after settlement: %d %s", a.status, a.body)
		}
	})
	var xrun string
	if err := h.db.Get(&xrun, "SELECT run_id FROM run_holds WHERE client_run_id = 'queue-task-7'"); err != nil {
		t.Fatal(err)
	}
	h.expectCharges(u.ID, []string{"r_redelivered_task_0001", xrun})
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
}

// The real OpenAI Go client retries a 409 on its own. With an Idempotency-Key, its retry of a
// request still running ends with the answer and one charge.
func TestOpenAIGoClientRetryOfIdempotentRequestChargesOnce(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	client := openai.NewClient(option.WithBaseURL(h.gw.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(10),
		option.WithHeader("Idempotency-Key", "sdk-retry-1"), option.WithHeader(fakellm.HeaderLatency, "1500ms"))
	params := openai.ChatCompletionNewParams{Model: "fake-gpt",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say it once.")}}
	type result struct {
		res  *openai.ChatCompletion
		resp *http.Response
		err  error
	}
	call := func() result {
		var r result
		r.res, r.err = client.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&r.resp))
		return r
	}
	firstc := make(chan result, 1)
	go func() { firstc <- call() }()
	h.waitLive(u.ID, 1)
	second := call() // first try: 409 request_in_progress; the client retries into the replay
	first := <-firstc
	if first.err != nil || second.err != nil {
		t.Fatalf("errors: %v / %v", first.err, second.err)
	}
	if first.res.Choices[0].Message.Content == "" || first.res.Choices[0].Message.Content != second.res.Choices[0].Message.Content {
		t.Fatalf("answers differ: %q / %q", first.res.Choices[0].Message.Content, second.res.Choices[0].Message.Content)
	}
	if second.resp.Header.Get(proxy.ReplayedHeader) != "true" {
		t.Fatalf("the second answer is not a replay: %v", second.resp.Header)
	}
	if n := h.fake.Calls(); n != 1 {
		t.Fatalf("%d upstream calls, want 1", n)
	}
	h.expectCharges(u.ID, []string{first.resp.Header.Get(proxy.RunIDHeader)})
}

// X-Session-Id with the message the session is still answering: 409 already_running with
// the running run's id; the resend's hold is released at 0.
func TestSessionSameMessageIsAlreadyRunning(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	t.Cleanup(func() { _ = h.srv.Close() })
	u, key := h.user("standard")
	first := make(chan answer, 1)
	go func() {
		first <- send(h.gw.URL, key, chatBody, map[string]string{"X-Session-Id": "tab-1", "X-Test-Gate": "first"})
	}()
	gate.await(t, "first", 1)
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	// A refresh resends the same message; the body differs in other fields, the message does not.
	resend := strings.Replace(chatBody, `"model":"fake-gpt"`, `"model":"fake-gpt","temperature":0.5`, 1)
	b := send(h.gw.URL, key, resend, map[string]string{"X-Session-Id": "tab-1"})
	openFirst() // the first ran until the resend was answered
	if b.status != 409 || errorCode(t, b.body) != "already_running" || b.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("resend: %d %v %s", b.status, b.header, b.body)
	}
	a := <-first
	if a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	runID := a.header.Get(proxy.RunIDHeader)
	if got := errorRunID(t, b.body); got != runID {
		t.Fatalf("already_running names %s, want %s", got, runID)
	}
	// Another session asking the same is not a duplicate.
	if c := send(h.gw.URL, key, chatBody, map[string]string{"X-Session-Id": "tab-2"}); c.status != 200 {
		t.Fatalf("other session: %d %s", c.status, c.body)
	} else {
		h.expectCharges(u.ID, []string{runID, c.header.Get(proxy.RunIDHeader)}, holds.SourceDuplicate)
	}
}

// X-Session-Id with a different message: the session's running run is cancelled on the
// process that serves it (here another gateway process, reached through Redis pub/sub),
// settled by what it used with source cancel, and the new message runs.
func TestSessionNewMessageCancelsTheRunningOne(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	second, other := h.secondGateway(nil, nil)
	t.Cleanup(func() { _ = h.srv.Close() })

	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Session-Id", "chat-9")
	req.Header.Set(fakellm.HeaderChunks, "2000")
	req.Header.Set(fakellm.HeaderChunkInterval, "5ms")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	oldRun := resp.Header.Get(proxy.RunIDHeader)
	rd := afterContent(t, resp, 3)

	b := sendOK(t, "new message", other, key, chatBody, map[string]string{"X-Session-Id": "chat-9"})
	waitSettlements(t, second)
	// The old stream ends early, with an error event that says why.
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("old stream did not end as superseded: ...%s", rest[max(0, len(rest)-300):])
	}
	run := h.run(u.ID, oldRun)
	if run.SettleSource.String != holds.SourceCancel || run.OutTok < 3 || run.OutTok >= 2000 {
		t.Fatalf("old run = %+v, want settled by cancel with its partial output", run)
	}
	h.settled()
	h.expectCharges(u.ID, []string{oldRun, b.header.Get(proxy.RunIDHeader)})
}

// When Redis cannot be reached, the fingerprint check refuses with 503 rather than risk a
// double run, and the hold it took is released; with fail_open the call goes through.
func TestFingerprintWithRedisDown(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { dead.Close() })

	_, closed := h.secondGateway(dead, nil)
	a := send(closed, key, chatBody, nil)
	if a.status != 503 || errorCode(t, a.body) != "dedup_unavailable" || a.header.Get("Retry-After") == "" {
		t.Fatalf("redis down: %d %v %s", a.status, a.header, a.body)
	}
	if n := h.fake.Calls(); n != 0 {
		t.Fatalf("%d upstream calls, want 0", n)
	}

	srv, open := h.secondGateway(dead, func(c *config.Config) { c.Dedup.FailOpen = true })
	b := sendOK(t, "fail_open", open, key, chatBody, nil)
	waitSettlements(t, srv)
	h.expectCharges(u.ID, []string{b.header.Get(proxy.RunIDHeader)}, holds.SourceRelease)
}

// A window of 0 turns the fingerprint check off: the same body twice at once runs twice.
func TestFingerprintWindowZeroIsOff(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Dedup.Window = 0 })
	u, key := h.user("standard")
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = send(h.gw.URL, key, chatBody, map[string]string{fakellm.HeaderLatency: "200ms"})
		}()
	}
	wg.Wait()
	var ids []string
	for _, a := range answers {
		if a.status != 200 {
			t.Fatalf("status %d: %s", a.status, a.body)
		}
		ids = append(ids, a.header.Get(proxy.RunIDHeader))
	}
	h.expectCharges(u.ID, ids)
}

// metric reads one series from /metrics ("" when absent).
func (h *harness) metric(series string) string {
	h.t.Helper()
	resp, err := http.Get(h.gw.URL + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, line := range strings.Split(string(readAll(h.t, resp.Body)), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestDuplicateChecksTellRoutesApart: one body can be a request on two routes ({"model",
// "input"} is an embeddings request and a Responses one). An Idempotency-Key sent again with it
// on the other route must not be answered with the first route's stored answer (a list of
// vectors to a caller of /v1/responses), but refused as the key reused (422); and the same
// body on another route while the first runs is no duplicate of it.
func TestDuplicateChecksTellRoutesApart(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	body := `{"model":"fake-gpt","input":"the same words"}`
	idem := map[string]string{"Idempotency-Key": "two-routes"}
	sendToOK(t, "embeddings", h.gw.URL, "/v1/embeddings", key, body, idem)
	h.settled()
	if other := sendTo(h.gw.URL, "/v1/responses", key, body, idem); other.status != http.StatusUnprocessableEntity {
		t.Fatalf("the key on another route: %d replayed=%q %.80s, want 422 idempotency_key_reused",
			other.status, other.header.Get(proxy.ReplayedHeader), other.body)
	} else if !strings.Contains(string(other.body), "route") {
		// The body is the same here: an answer that says only "a different request body"
		// sends the caller looking for a difference that is not there.
		t.Fatalf("the key on another route: %s, want the message to name the route", other.body)
	}

	slow := map[string]string{fakellm.HeaderLatency: "1s"}
	first := make(chan answer, 1)
	base := h.fake.Calls()
	go func() { first <- sendTo(h.gw.URL, "/v1/embeddings", key, body, slow) }()
	h.waitUpstream(base + 1)
	sendToOK(t, "the same body on another route while the first runs", h.gw.URL, "/v1/responses", key, body, nil)
	if a := <-first; a.status != http.StatusOK {
		t.Fatalf("embeddings: %d %s", a.status, a.body)
	}
}

// TestFingerprintTellsQueryAndBetaHeadersApart: the same body under another query (an API
// version) or another beta header asks for another answer; sent while the first runs it is no
// duplicate of it. A resend that differs only in a header no upstream answers by (an SDK's
// retry count) still is.
func TestFingerprintTellsQueryAndBetaHeadersApart(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	_, key := h.user("standard")
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"the same words"}]}`
	const path = "/v1/chat/completions"
	first := make(chan answer, 1)
	go func() { first <- sendTo(h.gw.URL, path, key, body, map[string]string{"X-Test-Gate": "first"}) }()
	gate.await(t, "first", 1)
	// The first runs until the resend below is answered.
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	for _, other := range []struct {
		name, path string
		hdr        map[string]string
	}{
		{"another query", path + "?api-version=2024-10-21", nil},
		{"a beta header", path, map[string]string{"Anthropic-Beta": "token-efficient-tools-2025-02-19"}},
		{"a prefixed beta header", path, map[string]string{"X-Pass-Anthropic-Beta": "token-efficient-tools-2025-02-19"}},
		{"an API version header", path, map[string]string{"Anthropic-Version": "2024-01-01"}},
		{"an OpenAI beta header", path, map[string]string{"OpenAI-Beta": "assistants=v2"}},
	} {
		sendToOK(t, fmt.Sprintf("the same body under %s while the first runs", other.name), h.gw.URL, other.path, key, body, other.hdr)
	}
	resend := sendTo(h.gw.URL, path, key, body, map[string]string{"X-Stainless-Retry-Count": "1"})
	if resend.status != http.StatusConflict || !strings.Contains(string(resend.body), `"duplicate"`) {
		t.Fatalf("a resend differing in its retry count: %d %s, want 409 duplicate", resend.status, resend.body)
	}
	openFirst()
	if a := <-first; a.status != http.StatusOK {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
}

// TestDuplicateSaysHowToRunTheSameBodyAtOnce: the same body sent twice at once on purpose
// (samples at a temperature) is refused as a double click is; the 409 tells the caller how to
// run it anyway, and doing so runs both, each charged.
func TestDuplicateSaysHowToRunTheSameBodyAtOnce(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","temperature":1.2,"messages":[{"role":"user","content":"Name a colour."}]}`
	first := make(chan answer, 1)
	go func() { first <- send(h.gw.URL, key, body, map[string]string{"X-Test-Gate": "first"}) }()
	gate.await(t, "first", 1)
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	dup := send(h.gw.URL, key, body, nil)
	openFirst() // the first ran until the second sample was answered
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(dup.body, &e); err != nil || dup.status != http.StatusConflict || e.Error.Code != "duplicate" {
		t.Fatalf("second sample: %d %s, want 409 duplicate", dup.status, dup.body)
	}
	if !strings.Contains(e.Error.Message, "Idempotency-Key") {
		t.Fatalf("409 duplicate says %q: nothing of how to run the same request more than once at a time", e.Error.Message)
	}
	a := <-first
	var samples []string
	var wg sync.WaitGroup
	answers := make([]answer, 2)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = send(h.gw.URL, key, body, map[string]string{proxy.IdempotencyKeyHeader: fmt.Sprintf("sample-%d", i),
				fakellm.HeaderLatency: "300ms"})
		}()
	}
	wg.Wait()
	for _, b := range answers {
		if b.status != http.StatusOK {
			t.Fatalf("a sample under its own key: %d %s", b.status, b.body)
		}
		samples = append(samples, b.header.Get(proxy.RunIDHeader))
	}
	h.expectCharges(u.ID, append(samples, a.header.Get(proxy.RunIDHeader)), holds.SourceDuplicate)
}
