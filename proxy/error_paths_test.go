package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// gateUpstream stands in front of a fakellm: a request with X-Test-Gate waits at the upstream
// until its gate opens (or the gateway gives up on it), so a test can hold a call in flight
// for as long as it needs, without sleeping; X-Test-Upstream makes it answer as a broken
// provider would.
type gateUpstream struct {
	fake  *fakellm.Server
	mu    sync.Mutex
	gates map[string]*gate
}

// gate is where calls naming it wait: arrived gets one value per call that reaches it.
type gate struct {
	open    chan struct{}
	opened  sync.Once
	arrived chan struct{}
}

func newGateUpstream() *gateUpstream {
	return &gateUpstream{fake: fakellm.New(fakellm.Config{}), gates: map[string]*gate{}}
}

func (g *gateUpstream) gate(name string) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt, ok := g.gates[name]
	if !ok {
		gt = &gate{open: make(chan struct{}), arrived: make(chan struct{}, 64)}
		g.gates[name] = gt
	}
	return gt
}

// open lets the calls waiting at gate name (and any later ones) through. Opening it again
// does nothing, so a test can both open it and have its cleanup open it: a call left waiting
// at a gate when the test fails holds the harness's cleanup, which waits for it, until
// limits.upstream_timeout (5 minutes) ends it.
func (g *gateUpstream) open(name string) {
	gt := g.gate(name)
	gt.opened.Do(func() { close(gt.open) })
}

// await waits until n calls have reached gate name.
func (g *gateUpstream) await(t *testing.T, name string, n int) {
	t.Helper()
	for ; n > 0; n-- {
		select {
		case <-g.gate(name).arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("no call reached gate %q", name)
		}
	}
}

func (g *gateUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Header.Get("X-Test-Upstream") {
	case "html":
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html><body>Sign in to the hotel wifi</body></html>")
		return
	case "cut":
		// A whole JSON answer that breaks its Content-Length.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hel`)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	case "empty":
		// A 200 with nothing in it: no model's answer, whole.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "0")
		return
	case "empty-stream":
		// A stream's 200 and headers, then its end, with no event.
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		return
	case "big-error":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error"}}`, strings.Repeat("x", 70<<10))
		return
	}
	if name := r.Header.Get("X-Test-Gate"); name != "" {
		// The body read whole first: only then does net/http notice a caller that gives up.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		gt := g.gate(name)
		gt.arrived <- struct{}{}
		select {
		case <-gt.open:
		case <-r.Context().Done():
			return
		}
	}
	if name := r.Header.Get("X-Test-Hold-Stream"); name != "" {
		w = &heldStream{ResponseWriter: w, gate: g.gate(name), ctx: r.Context()}
	}
	g.fake.ServeHTTP(w, r)
}

// heldMidStream is hdr asking gate to hold the call mid-stream at name (X-Test-Hold-Stream),
// and the func that lets it go on (once; at the test's end at the latest).
func heldMidStream(t *testing.T, gate *gateUpstream, name string, hdr map[string]string) (map[string]string, func()) {
	var once sync.Once
	letGo := func() { once.Do(func() { gate.open(name) }) }
	t.Cleanup(letGo)
	return with(hdr, "X-Test-Hold-Stream", name), letGo
}

// heldStreamOK posts a stream (streamBody) that gate holds mid-stream at name (heldMidStream)
// and requires its 200: the call is admitted and runs until letGo. Its body closes at the
// test's end.
func (h *harness) heldStreamOK(t *testing.T, gate *gateUpstream, key, name string, hdr map[string]string) (*http.Response, func()) {
	t.Helper()
	held, letGo := heldMidStream(t, gate, name, hdr)
	resp := h.post(key, "/v1/chat/completions", streamBody, held)
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", name, resp.StatusCode, readAll(t, resp.Body))
	}
	return resp, letGo
}

// heldStream lets an answer's first write through (a stream's first event) and holds the next
// until its gate opens or the gateway gives up on the call: the call runs, mid-stream, for as
// long as the test needs, where a stream paced by X-Fake-Chunk-Interval alone ends on its own
// in a fixed time (its events fit in the sockets' buffers whether or not the caller reads).
type heldStream struct {
	http.ResponseWriter
	gate  *gate
	ctx   context.Context
	wrote bool
}

func (h *heldStream) Write(p []byte) (int, error) {
	if h.wrote {
		select {
		case <-h.gate.open:
		case <-h.ctx.Done():
			return 0, h.ctx.Err()
		}
	}
	h.wrote = true
	return h.ResponseWriter.Write(p)
}

// Unwrap lets fakellm's http.ResponseController flush the answer's writes.
func (h *heldStream) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// gatedObservedHarness is a harness whose one upstream, up (its BaseURL set here), is the
// gateUpstream it returns, and whose log lines, INFO and above, the test reads.
func gatedObservedHarness(t *testing.T, up config.Upstream) (*harness, *gateUpstream, *observer.ObservedLogs) {
	t.Helper()
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	up.BaseURL = gateSrv.URL
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, func(c *config.Config) { c.Upstreams = []config.Upstream{up} })
	return h, gate, logs
}

// gatedHarness is newHarness whose upstreams are one gateUpstream, returned: a call with
// X-Test-Gate stays with the upstream, running, until the test opens its gate, instead of for
// a fixed latency a slow machine can outlast before the test's next step (X-Test-Gate is no
// header the fingerprint window tells requests apart by). Its calls are counted by the gate's
// fakellm, not h.fake.
func gatedHarness(t *testing.T, mutate func(*config.Config)) (*harness, *gateUpstream) {
	t.Helper()
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	h := newHarness(t, func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].BaseURL = gateSrv.URL
		}
		if mutate != nil {
			mutate(c)
		}
	})
	return h, gate
}

// errEnv is what one row of the error table works with: a fresh user of the row's plan.
type errEnv struct {
	t    *testing.T
	h    *harness
	gate *gateUpstream
	user holds.User
	key  string
}

func (e *errEnv) post(path, body string, hdr map[string]string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.h.gw.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// inBackground sends a call that runs beside the row's own and returns its answer when done.
func (e *errEnv) inBackground(path, body string, hdr map[string]string) <-chan answer {
	out := make(chan answer, 1)
	go func() { out <- sendTo(e.h.gw.URL, path, e.key, body, hdr) }()
	return out
}

// callThenSettle makes one more call of the named run id, which must be served (the error
// left the run open and its budget free), then settles it.
func (e *errEnv) callThenSettle(id string) {
	e.t.Helper()
	if a := sendTo(e.h.gw.URL, "/v1/chat/completions", e.key, `{"model":"fake-gpt","messages":[{"role":"user","content":"and again"}]}`,
		map[string]string{"X-Run-Id": id}); a.status != http.StatusOK {
		e.t.Errorf("a call of run %s after the error: %d %s; want 200", id, a.status, a.body)
	}
	e.h.settled()
	e.settle(id)
}

func (e *errEnv) settle(id string) {
	e.t.Helper()
	if status, body := e.h.settleRun(e.key, id); status != http.StatusOK {
		e.t.Fatalf("settle %s: %d %s", id, status, body)
	}
}

// errRow is one error answer of the gateway, driven through its real HTTP path.
type errRow struct {
	name   string
	plan   string // the row's user's plan; "" is standard
	send   func(e *errEnv) *http.Response
	status int
	code   string
	// anthropic: the answer must be in Anthropic's shape ({"type":"error","error":{...}}).
	anthropic bool
	// passthrough: the upstream's own error, passed on as it sent it (its code may be null).
	passthrough bool
	// streamed: the error is the last event of a stream whose 200 went out.
	streamed bool
	// forwarded: the call reached the upstream, so its answer names its run and the run
	// settles with source (charged > 0 when charged).
	forwarded bool
	source    string
	charged   bool
	// unknownCaller: the refusal happens before the caller is known (no user, no run id).
	unknownCaller bool
	// noRun: a request that is no model call (a token count): its line names its user, no run.
	noRun bool
	// sharedRun: the run the refusal names is another call's (a settled run, a key's running
	// attempt): what it was charged is that call's.
	sharedRun bool
	// unlogged explains an answer that writes no line (a route error, no call).
	unlogged string
	// logged is the message of the line an answer without a code field writes.
	logged string
	// cleanup runs after the answer (e.g. settles the named run the row leaves open by
	// design), before the leftovers are checked.
	cleanup func(e *errEnv)
	// retry is the immediately following correct request, which must be answered retryStatus
	// (200 unless set): the error must not leave the key, session, run or fingerprint pinned.
	retry       func(e *errEnv) *http.Response
	retryStatus int
	// header is what the README says the answer carries besides (Retry-After, X-Should-Retry).
	header map[string]string
	// namesRun: the error names the run it refers to (error.run_id), as the duplicate family's do.
	namesRun bool
	// alsoCounted are the error answers besides the row's own that its send provokes (the
	// bodies it holds to fill the memory bound, cut when it is done), by tollgate_error_answers_total's labels.
	alsoCounted map[string]int64
}

// heldBodiesCut is what the bodies whileBodiesHeld holds as who says (two for callerFull, four
// for processFull: bodyHolders) count once they are cut: each is answered 400 unreadable_body.
func heldBodiesCut(who int) map[string]int64 {
	n := int64(2)
	if who == processFull {
		n = 4
	}
	return map[string]int64{`code="unreadable_body",status="400"`: n}
}

const (
	errAdminToken = "admin-token-0123456789"
	errMsgBody    = `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	errRespBody   = `{"model":"fake-gpt","input":"hi"}`
)

// TestEveryErrorAnswerIsClearAndLeavesNothing drives every error the gateway answers through
// its HTTP path and checks the rule of README "Errors": the answer is the route's error shape
// (OpenAI's, Anthropic's on /v1/messages) with a status, a type, a code and a message, as JSON;
// it names a run (X-Tollgate-Run-Id) exactly when the call was forwarded; a line at INFO or
// above names the run; afterwards the caller holds nothing (no hold queued or running, nothing
// in flight), no Redis key is left without an expiry, an error before forwarding is charged 0
// and one after is settled as the README says, and an immediate correct retry is served.
//
// Not driven here, since nothing outside the gateway can cause them: 500 internal_error (the
// upstream request cannot be built: a configured base_url that parses) and 499
// client_closed_request (its caller has left and reads nothing; see client_left_test.go).
func TestEveryErrorAnswerIsClearAndLeavesNothing(t *testing.T) {
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	// Port 1 on loopback refuses every connection. A port picked free and closed again
	// did not: a server another test started in parallel was given it, and the "dead"
	// upstream answered 401 (seen once in CI).
	const deadAddr = "127.0.0.1:1"
	deadURL := "http://" + deadAddr

	core, logs := observer.New(zapcore.InfoLevel)
	// The admin API, mounted as cmd/gateway mounts it; its store is built on the harness's DB.
	var adminStore *holds.Store
	adminAPI := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admin.New(adminStore, 1000, errAdminToken, zap.New(core)).ServeHTTP(w, r)
	})
	h := newHarnessOn(t, harnessSetup{log: zap.New(core), admin: adminAPI}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{
			{Name: "dead", Kind: "openai", BaseURL: deadURL, Models: []string{"dead-gpt"}},
			{Name: "gate-openai", Kind: "openai", BaseURL: gateSrv.URL, Models: []string{"*"}},
			{Name: "gate-anthropic", Kind: "anthropic", BaseURL: gateSrv.URL, Models: []string{"claude*"}},
		}
		c.Models["claude-test"] = c.Models["fake-gpt"]
		c.Models["dead-gpt"] = c.Models["fake-gpt"]
		audio := c.Models["fake-gpt"]
		audio.AudioInput = audio.Output
		c.Models["audio-gpt"] = audio
		c.Limits.MaxBodyBytes = 64 << 10
		c.Limits.MaxBodyMemory, c.Limits.MaxBodyMemoryPerCaller = 256<<10, 128<<10
		// The timeouts run from before a call's request is written: at 500 ms (a stream's
		// headers) and 1 s a loaded machine could run out of them before an answer came (504,
		// not the row's answer) or before the request was sent whole (an upstream_timeout row
		// charged 0). The rows that wait for them ("late") take this long.
		c.Limits.HeaderTimeout = 1500 * time.Millisecond
		c.Limits.UpstreamTimeout = 2 * time.Second
		c.Limits.ClientWriteTimeout = 2 * time.Second
		// The "key still cached" cases check that it was: the default 2 s could end between
		// their two calls on a slow machine.
		c.Limits.KeyCacheTTL = time.Minute
		// With calls this short, a settlement (plus its last reply's wait) must end sooner
		// than the default allows: a run settled on request stays closed only as long.
		c.Limits.SettleTimeout = 10 * time.Second
		c.Limits.MaxResponseBytes = 4 << 10
		c.Dedup.MaxReplayLen = 8 << 10
		broke := c.Plans["standard"]
		broke.AllowanceCredits = config.CreditsOf(0)
		c.Plans["broke"] = broke
		one := c.Plans["standard"]
		one.MaxInFlight = 1
		c.Plans["one"] = one
		tiny := c.Plans["standard"]
		tiny.MaxRunCostCredits, tiny.HoldNormalCredits, tiny.HoldHeavyCredits = config.Credits{Milli: 1}, config.Credits{Milli: 1}, config.Credits{Milli: 1}
		c.Plans["tiny"] = tiny
	})

	adminStore = h.store
	// The other gateways of the test count in the harness's metrics, as its own answers do.
	disabledAdmin := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys, Tally: h.tally, Leases: h.leases,
		Log: zap.New(core), Metrics: h.metrics, Admin: admin.New(h.store, 1000, "", zap.New(core))})
	disabledAdminGW := httptest.NewServer(disabledAdmin.Handler())
	t.Cleanup(func() { disabledAdminGW.Close(); _ = disabledAdmin.Close() })
	// A gateway whose duplicate checks cannot reach Redis, and one that is draining for its exit.
	deadRedis := redis.NewClient(&redis.Options{Addr: deadAddr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { deadRedis.Close() })
	dedupDown := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys, Tally: h.tally, Leases: h.leases,
		Log: zap.New(core), Metrics: h.metrics, DedupRedis: deadRedis})
	dedupDownGW := httptest.NewServer(dedupDown.Handler())
	t.Cleanup(func() { dedupDownGW.Close(); _ = dedupDown.Close() })
	deadDedup := dedupDownGW.URL
	// settled waits for the settlements of every gateway of the test.
	settled := func() {
		h.settled()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dedupDown.WaitSettlements(ctx); err != nil {
			t.Fatalf("settlements: %v", err)
		}
	}
	drained := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: h.rdb, Keys: h.keys, Tally: h.tally, Leases: h.leases,
		Log: zap.New(core), Metrics: h.metrics})
	drainedGW := httptest.NewServer(drained.Handler())
	t.Cleanup(func() { drainedGW.Close(); _ = drained.Close() })
	if err := drained.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Answers made for another user, as the gateway records them (spoken.go, continuation.go).
	for _, k := range []string{h.keys.SpokenOwner("audio_theirs"), h.keys.ResponseOwner("resp_theirs")} {
		if err := h.rdb.Set(context.Background(), k, "999999999", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	at := func(url, path, body string, hdr map[string]string) func(e *errEnv) *http.Response {
		return func(e *errEnv) *http.Response {
			a := sendTo(url, path, e.key, body, hdr)
			if a.err != nil {
				e.t.Fatal(a.err)
			}
			sent, err := http.NewRequest(http.MethodPost, url+path, nil)
			if err != nil {
				e.t.Fatal(err)
			}
			return &http.Response{StatusCode: a.status, Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body)), Request: sent}
		}
	}

	ok := func(path, body string, hdr map[string]string) func(e *errEnv) *http.Response {
		return func(e *errEnv) *http.Response { return e.post(path, body, hdr) }
	}
	chat := func(body string, hdr map[string]string) func(e *errEnv) *http.Response {
		return ok("/v1/chat/completions", body, hdr)
	}
	okChat := chat(chatBody, nil)
	// A failure charged for what the provider did is not to be resent by an SDK (writeCallError).
	noRetry := map[string]string{"X-Should-Retry": "false", "Retry-After": ""}
	bad := func(name, body, code string) errRow {
		return errRow{name: name, send: chat(body, nil), status: 400, code: code, retry: okChat}
	}
	rows := []errRow{
		// Before the caller is known.
		{name: "401 no key", send: func(e *errEnv) *http.Response { return e.h.post("", "/v1/chat/completions", chatBody, nil) },
			status: 401, code: "invalid_api_key", unknownCaller: true, retry: okChat},
		{name: "401 no key, messages", send: func(e *errEnv) *http.Response {
			return e.h.post("", "/v1/messages", errMsgBody, map[string]string{"x-api-key": "nope"})
		}, status: 401, code: "invalid_api_key", anthropic: true, unknownCaller: true},
		{name: "401 no key, count_tokens", send: func(e *errEnv) *http.Response {
			return e.h.post("", "/v1/messages/count_tokens", errMsgBody, map[string]string{"x-api-key": "nope"})
		}, status: 401, code: "invalid_api_key", anthropic: true, unknownCaller: true},
		{name: "404 route", send: ok("/v1/nothing", chatBody, nil), status: 404, code: "not_found",
			unknownCaller: true, unlogged: "no such route: no call, no run"},
		{name: "404 under messages", send: ok("/v1/messages/batches", errMsgBody, nil), status: 404, code: "not_found",
			anthropic: true, unknownCaller: true, unlogged: "no such route: no call, no run"},
		{name: "405", send: func(e *errEnv) *http.Response {
			req, _ := http.NewRequest(http.MethodGet, e.h.gw.URL+"/v1/messages", nil)
			req.Header.Set("x-api-key", e.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				e.t.Fatal(err)
			}
			return resp
		}, status: 405, code: "method_not_allowed", anthropic: true, unknownCaller: true, unlogged: "a wrong method: no call, no run"},
		{name: "404 model", send: func(e *errEnv) *http.Response {
			req, _ := http.NewRequest(http.MethodGet, e.h.gw.URL+"/v1/models/no-such-model", nil)
			req.Header.Set("Authorization", "Bearer "+e.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				e.t.Fatal(err)
			}
			return resp
		}, status: 404, code: "model_not_found", unknownCaller: true, unlogged: "a lookup: no call, no run"},
		{name: "404 run", send: ok("/v1/runs/no-such-run/settle", "", nil), status: 404, code: "run_not_found", unknownCaller: true},

		// The body and the request's ids, before anything is held.
		{name: "415", send: chat(chatBody, map[string]string{"Content-Encoding": "gzip"}), status: 415, code: "unsupported_content_encoding", retry: okChat},
		{name: "415 messages", send: ok("/v1/messages", errMsgBody, map[string]string{"Content-Encoding": "gzip"}), status: 415,
			code: "unsupported_content_encoding", anthropic: true},
		{name: "413", send: chat(`{"model":"fake-gpt","pad":"`+strings.Repeat("x", 65<<10)+`"}`, nil), status: 413, code: "request_too_large", retry: okChat},
		{name: "413 messages", send: ok("/v1/messages", `{"model":"claude-test","pad":"`+strings.Repeat("x", 65<<10)+`"}`, nil),
			status: 413, code: "request_too_large", anthropic: true},
		{name: "413 count_tokens", send: ok("/v1/messages/count_tokens", `{"model":"claude-test","pad":"`+strings.Repeat("x", 65<<10)+`"}`, nil),
			status: 413, code: "request_too_large", anthropic: true, noRun: true},
		{name: "408", send: func(e *errEnv) *http.Response {
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.Close() })
			go func() { _, _ = pw.Write([]byte(`{"model":"fake-gpt",`)) }() // and then nothing
			req, _ := http.NewRequest(http.MethodPost, e.h.gw.URL+"/v1/chat/completions", pr)
			req.Header.Set("Authorization", "Bearer "+e.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				e.t.Fatal(err)
			}
			return resp
		}, status: 408, code: "request_timeout", retry: okChat},
		// Bodies held in memory (bodyMemory): 128 KiB a caller, 256 KiB in all.
		{name: "429 too_many_request_bytes", send: whileBodiesHeld(callerFull, "/v1/chat/completions", "fake-gpt"), alsoCounted: heldBodiesCut(callerFull),
			header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_request_bytes", retry: okChat},
		{name: "429 too_many_request_bytes, messages", send: whileBodiesHeld(callerFull, "/v1/messages", "claude-test"), alsoCounted: heldBodiesCut(callerFull),
			header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_request_bytes", anthropic: true},
		// A chunked body has no Content-Length to refuse it by: it is refused as it is read.
		{name: "429 too_many_request_bytes, chunked", send: whileBodiesHeldChunked(callerFull, "/v1/chat/completions", "fake-gpt"), alsoCounted: heldBodiesCut(callerFull),
			header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_request_bytes", retry: okChat},
		{name: "503 server_busy, chunked", send: whileBodiesHeldChunked(processFull, "/v1/chat/completions", "fake-gpt"), alsoCounted: heldBodiesCut(processFull),
			header: map[string]string{"Retry-After": "1"}, status: 503, code: "server_busy", retry: okChat},
		{name: "503 server_busy", send: whileBodiesHeld(processFull, "/v1/chat/completions", "fake-gpt"), alsoCounted: heldBodiesCut(processFull),
			header: map[string]string{"Retry-After": "1"}, status: 503, code: "server_busy", retry: okChat},
		{name: "503 server_busy, count_tokens", send: whileBodiesHeld(processFull, "/v1/messages/count_tokens", "claude-test"), alsoCounted: heldBodiesCut(processFull),
			header: map[string]string{"Retry-After": "1"}, status: 503, code: "server_busy", anthropic: true, noRun: true},
		bad("invalid_json", `{"model":`, "invalid_json"),
		{name: "invalid_json messages", send: ok("/v1/messages", `{"model":`, nil), status: 400, code: "invalid_json", anthropic: true},
		{name: "invalid_json count_tokens", send: ok("/v1/messages/count_tokens", `{"model":`, nil), status: 400, code: "invalid_json", anthropic: true, noRun: true},
		bad("missing_model", `{"messages":[{"role":"user","content":"hi"}]}`, "missing_model"),
		bad("invalid_max_tokens", `{"model":"fake-gpt","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "invalid_max_tokens"),
		bad("invalid_max_completion_tokens", `{"model":"fake-gpt","max_completion_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`, "invalid_max_completion_tokens"),
		{name: "invalid_max_output_tokens", send: ok("/v1/responses", `{"model":"fake-gpt","max_output_tokens":0,"input":"hi"}`, nil), status: 400,
			code: "invalid_max_output_tokens", retry: ok("/v1/responses", errRespBody, nil)},
		bad("invalid_n", `{"model":"fake-gpt","n":0,"messages":[{"role":"user","content":"hi"}]}`, "invalid_n"),
		bad("invalid_n past 128", `{"model":"fake-gpt","n":129,"messages":[{"role":"user","content":"hi"}]}`, "invalid_n"),
		{name: "invalid_best_of past 128", send: ok("/v1/completions", `{"model":"fake-gpt","best_of":129,"prompt":"hi"}`, nil), status: 400, code: "invalid_best_of"},
		{name: "invalid_best_of", send: ok("/v1/completions", `{"model":"fake-gpt","best_of":500,"prompt":"hi"}`, nil), status: 400, code: "invalid_best_of"},
		bad("invalid_stream", `{"model":"fake-gpt","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "invalid_stream"),
		bad("invalid_stream_options", `{"model":"fake-gpt","stream":true,"stream_options":1,"messages":[{"role":"user","content":"hi"}]}`, "invalid_stream_options"),
		bad("invalid_models", `{"model":"fake-gpt","models":"x","messages":[{"role":"user","content":"hi"}]}`, "invalid_models"),
		{name: "unsupported_parameter", send: ok("/v1/responses", `{"model":"fake-gpt","background":true,"input":"hi"}`, nil), status: 400, code: "unsupported_parameter"},
		{name: "missing_max_tokens", send: ok("/v1/messages", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`, nil),
			status: 400, code: "missing_max_tokens", anthropic: true},
		bad("model_not_priced", `{"model":"no-price","messages":[{"role":"user","content":"hi"}]}`, "model_not_priced"),
		{name: "model_not_served", send: ok("/v1/messages", `{"model":"fake-gpt","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`, nil),
			status: 400, code: "model_not_served", anthropic: true},
		{name: "model_not_served count_tokens", send: ok("/v1/messages/count_tokens", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`, nil),
			status: 400, code: "model_not_served", anthropic: true, noRun: true},
		bad("model_too_long", `{"model":"fake-gpt-`+strings.Repeat("x", 200)+`","messages":[]}`, "model_too_long"),
		bad("invalid_model", "{\"model\":\"fake-gpt-\xff\xfe\",\"messages\":[]}", "invalid_model"),
		{name: "unpriced_option", send: ok("/v1/messages", `{"model":"claude-test","max_tokens":50,"inference_geo":"us","messages":[{"role":"user","content":"hi"}]}`, nil),
			status: 400, code: "unpriced_option", anthropic: true},
		{name: "invalid_run_id", send: chat(chatBody, map[string]string{"X-Run-Id": "bad id!"}), status: 400, code: "invalid_run_id", retry: okChat},
		{name: "invalid_idempotency_key", send: chat(chatBody, map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}), status: 400, code: "invalid_idempotency_key"},
		{name: "invalid_session_id", send: chat(chatBody, map[string]string{"X-Session-Id": "bad id!"}), status: 400, code: "invalid_session_id"},
		{name: "invalid_request", send: chat(chatBody, map[string]string{"X-Run-Id": "r1", "X-Session-Id": "s1"}), status: 400, code: "invalid_request",
			retry: chat(chatBody, map[string]string{"X-Session-Id": "s1"})},

		{name: "unreadable_body", send: func(e *errEnv) *http.Response {
			conn, err := net.Dial("tcp", e.h.gw.Listener.Addr().String())
			if err != nil {
				e.t.Fatal(err)
			}
			defer conn.Close()
			_, _ = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
				"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\nzz\r\n", e.key)
			sent, err := http.NewRequest(http.MethodPost, e.h.gw.URL+"/v1/chat/completions", nil)
			if err != nil {
				e.t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), sent)
			if err != nil {
				e.t.Fatal(err)
			}
			b := readAll(e.t, resp.Body)
			resp.Body = io.NopCloser(bytes.NewReader(b))
			return resp
		}, status: 400, code: "unreadable_body", retry: okChat},
		{name: "too_many_audio_ids", send: func(e *errEnv) *http.Response {
			var b strings.Builder
			b.WriteString(`{"model":"audio-gpt","messages":[{"role":"user","content":"Say hello."}`)
			for i := range 1025 {
				fmt.Fprintf(&b, `,{"role":"assistant","audio":{"id":"audio_%d"}}`, i)
			}
			b.WriteString(`,{"role":"user","content":"Again."}]}`)
			return e.post("/v1/chat/completions", b.String(), nil)
		}, status: 400, code: "too_many_audio_ids", retry: okChat},
		bad("audio_not_found", `{"model":"audio-gpt","messages":[{"role":"user","content":"Say hello."},
			{"role":"assistant","audio":{"id":"audio_theirs"}},{"role":"user","content":"Again."}]}`, "audio_not_found"),
		{name: "previous_response_not_found", send: ok("/v1/responses", `{"model":"fake-gpt","previous_response_id":"resp_theirs","input":"hi"}`, nil),
			status: 400, code: "previous_response_not_found", retry: ok("/v1/responses", errRespBody, nil)},
		{name: "503 shutting_down", send: at(drainedGW.URL, "/v1/chat/completions", chatBody, nil), header: map[string]string{"Retry-After": "1"}, status: 503, code: "shutting_down", retry: okChat},
		{name: "503 shutting_down, messages", send: at(drainedGW.URL, "/v1/messages", errMsgBody, nil), header: map[string]string{"Retry-After": "1"}, status: 503, code: "shutting_down", anthropic: true},
		{name: "503 dedup_unavailable", send: at(deadDedup, "/v1/chat/completions", chatBody, nil), header: map[string]string{"Retry-After": "1"}, status: 503, code: "dedup_unavailable", retry: okChat},
		{name: "503 dedup_unavailable, idempotent", send: at(deadDedup, "/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "k-down"}),
			header: map[string]string{"Retry-After": "1"}, status: 503, code: "dedup_unavailable", retry: chat(chatBody, map[string]string{"Idempotency-Key": "k-down"})},
		// 503 billing_unavailable is driven in call_test.go (a lossy or dead database, past the
		// store's retries) and auth_bound_test.go: each takes seconds to run out.

		// The admin API: no call, no run; the caller's input mistakes are not logged (the
		// answer says it all), a store's refusal is ("admin request refused", with its code).
		{name: "admin 401", send: adminCall(http.MethodGet, "/admin/users", "", "wrong"), status: 401, code: "invalid_admin_token",
			unknownCaller: true, logged: "admin request refused: bad token"},
		{name: "admin 404 disabled", send: func(e *errEnv) *http.Response {
			return adminCallTo(e, disabledAdminGW.URL, http.MethodGet, "/admin/users", "", errAdminToken)
		}, status: 404, code: "admin_disabled", unknownCaller: true, unlogged: "no admin token configured: configuration, not a request's fault"},
		{name: "admin 404 route", send: adminCall(http.MethodGet, "/admin/nothing", "", errAdminToken), status: 404, code: "not_found",
			unknownCaller: true, unlogged: "no such route"},
		{name: "admin 405", send: adminCall(http.MethodDelete, "/admin/users", "", errAdminToken), status: 405, code: "method_not_allowed",
			unknownCaller: true, unlogged: "a wrong method"},
		{name: "admin 400 invalid_json", send: adminCall(http.MethodPost, "/admin/users", "{", errAdminToken), status: 400, code: "invalid_json",
			unknownCaller: true, unlogged: "the caller's input: the answer says what is wrong"},
		{name: "admin 413", send: adminCall(http.MethodPost, "/admin/users", `{"name":"`+strings.Repeat("x", 70<<10)+`"}`, errAdminToken),
			status: 413, code: "body_too_large", unknownCaller: true, unlogged: "the caller's input"},
		{name: "admin 400 invalid_limit", send: adminCall(http.MethodGet, "/admin/users?limit=0", "", errAdminToken), status: 400,
			code: "invalid_limit", unknownCaller: true, unlogged: "the caller's input"},
		{name: "admin 404 user", send: adminCall(http.MethodGet, "/admin/users/nobody-here", "", errAdminToken), status: 404,
			code: "user_not_found", unknownCaller: true},

		// Admission.
		{name: "402 nothing available", plan: "broke", send: okChat, status: 402, code: "insufficient_credits"},
		{name: "402 nothing available, messages", plan: "broke", send: ok("/v1/messages", errMsgBody, nil), status: 402,
			code: "insufficient_credits", anthropic: true},
		{name: "401 user disabled, key still cached", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "first", e.h.gw.URL, e.key, chatBody, nil)
			if _, err := e.h.store.DisableUser(context.Background(), e.user.ID); err != nil {
				e.t.Fatal(err)
			}
			cached := e.h.keyStaysCached()
			resp := e.post("/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"again"}]}`, nil)
			cached("the call after disabling")
			return resp
		}, status: 401, code: "invalid_api_key"},
		{name: "401 user disabled, messages", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "first", e.h.gw.URL, e.key, chatBody, nil)
			if _, err := e.h.store.DisableUser(context.Background(), e.user.ID); err != nil {
				e.t.Fatal(err)
			}
			cached := e.h.keyStaysCached()
			resp := e.post("/v1/messages", errMsgBody, map[string]string{"Idempotency-Key": "k-disabled"})
			cached("the call after disabling")
			return resp
		}, status: 401, code: "invalid_api_key", anthropic: true},
		{name: "402 nothing available, idempotent", plan: "broke", send: chat(chatBody, map[string]string{"Idempotency-Key": "k-broke"}),
			status: 402, code: "insufficient_credits"},
		{name: "429 too many in flight, idempotent", plan: "one", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "run", e.h.gw.URL, e.key, chatBody, map[string]string{"X-Run-Id": "open"})
			return e.post("/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "k-busy"})
		}, header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_in_flight", cleanup: func(e *errEnv) { e.settle("open") },
			retry: chat(chatBody, map[string]string{"Idempotency-Key": "k-busy"})},
		{name: "402 prompt over the cap", plan: "tiny", send: okChat, status: 402, code: "insufficient_credits"},
		{name: "402 run budget", plan: "tiny", send: chat(chatBody, map[string]string{"X-Run-Id": "small"}), status: 402,
			code: "run_budget_exhausted", cleanup: func(e *errEnv) { e.settle("small") }},
		{name: "402 prompt over the cap in a session", plan: "tiny", send: chat(chatBody, map[string]string{"X-Session-Id": "s-tiny"}), status: 402,
			code: "insufficient_credits", retry: chat(chatBody, map[string]string{"X-Session-Id": "s-tiny"}), retryStatus: 402},
		{name: "402 prompt over the cap, idempotent", plan: "tiny", send: chat(chatBody, map[string]string{"Idempotency-Key": "k-tiny"}), status: 402,
			code: "insufficient_credits", retry: chat(chatBody, map[string]string{"Idempotency-Key": "k-tiny"}), retryStatus: 402},
		{name: "402 prompt over the cap in a session, messages", plan: "tiny", send: ok("/v1/messages", errMsgBody, map[string]string{"X-Session-Id": "s-tiny"}),
			status: 402, code: "insufficient_credits", anthropic: true},
		{name: "402 run budget, messages", plan: "tiny", send: ok("/v1/messages", errMsgBody, map[string]string{"X-Run-Id": "small"}), status: 402,
			code: "run_budget_exhausted", anthropic: true, cleanup: func(e *errEnv) { e.settle("small") }},
		{name: "429 too many in flight", plan: "one", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "run", e.h.gw.URL, e.key, chatBody, map[string]string{"X-Run-Id": "open"})
			return e.post("/v1/chat/completions", chatBody, nil)
		}, header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_in_flight", cleanup: func(e *errEnv) { e.settle("open") }, retry: okChat},
		{name: "429 too many calls of a run", plan: "one", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "par", "X-Test-Gate": "par"})
			e.gate.await(e.t, "par", 1)
			resp := e.post("/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "par"})
			e.gate.open("par")
			if a := <-first; a.status != 200 {
				e.t.Fatalf("first: %d %s", a.status, a.body)
			}
			return resp
		}, header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_in_flight", sharedRun: true, cleanup: func(e *errEnv) { e.callThenSettle("par") }},
		{name: "409 run settled", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "run", e.h.gw.URL, e.key, chatBody, map[string]string{"X-Run-Id": "done"})
			e.settle("done")
			return e.post("/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "done"})
		}, header: map[string]string{"X-Should-Retry": "false"}, status: 409, code: "run_settled", sharedRun: true, retry: okChat},
		{name: "409 run_in_progress", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"X-Test-Gate": "self"})
			e.gate.await(e.t, "self", 1)
			var runID string
			if err := e.h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ?", e.user.ID); err != nil {
				e.t.Fatal(err)
			}
			resp := e.post("/v1/runs/"+runID+"/settle", "", nil)
			e.gate.open("self")
			<-first
			return resp
		}, status: 409, code: "run_in_progress", sharedRun: true},
		{name: "409 run_busy", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "busy", "X-Test-Gate": "busy"})
			e.gate.await(e.t, "busy", 1)
			resp := e.post("/v1/runs/busy/settle", "", nil)
			e.gate.open("busy")
			<-first
			return resp
		}, header: map[string]string{"Retry-After": "1"}, status: 409, code: "run_busy", sharedRun: true, cleanup: func(e *errEnv) { e.callThenSettle("busy") }},

		// Duplicates.
		{name: "409 duplicate", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"X-Test-Gate": "dup"})
			e.gate.await(e.t, "dup", 1)
			resp := e.post("/v1/chat/completions", chatBody, nil)
			e.gate.open("dup")
			<-first
			return resp
		}, header: map[string]string{"X-Should-Retry": "false"}, namesRun: true, status: 409, code: "duplicate", retry: okChat},
		{name: "409 request_in_progress", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "k-run", "X-Test-Gate": "idem"})
			e.gate.await(e.t, "idem", 1)
			resp := e.post("/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "k-run"})
			e.gate.open("idem")
			<-first
			return resp
		}, header: map[string]string{"Retry-After": "1", "X-Should-Retry": "true"}, namesRun: true, status: 409, code: "request_in_progress", sharedRun: true},
		{name: "422 idempotency_key_reused", send: func(e *errEnv) *http.Response {
			sendOK(e.t, "first", e.h.gw.URL, e.key, chatBody, map[string]string{"Idempotency-Key": "k-reused"})
			return e.post("/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"another"}]}`,
				map[string]string{"Idempotency-Key": "k-reused"})
		}, status: 422, code: "idempotency_key_reused", retry: chat(chatBody, map[string]string{"Idempotency-Key": "k-reused"})},
		{name: "409 idempotent_response_too_large", send: func(e *errEnv) *http.Response {
			big := map[string]string{"Idempotency-Key": "k-big", fakellm.HeaderChunks: "1500", "X-Test-Upstream": ""}
			sendOK(e.t, "first", e.h.gw.URL, e.key, `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, big)
			e.h.settled()
			return e.post("/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, big)
		}, header: map[string]string{"X-Should-Retry": "false"}, namesRun: true, status: 409, code: "idempotent_response_too_large"},
		{name: "409 idempotent_response_lost", send: func(e *errEnv) *http.Response {
			hdr := map[string]string{"Idempotency-Key": "k-lost"}
			sendOK(e.t, "first", e.h.gw.URL, e.key, chatBody, hdr)
			e.h.settled()
			ctx := context.Background()
			rec := e.h.keys.Replay(proxy.IdempotentRunID(e.user.ID, "k-lost", 0))
			if n, err := e.h.rdb.HDel(ctx, rec, "resp").Result(); err != nil || n != 1 {
				e.t.Fatalf("replay record %s: %d fields deleted, %v", rec, n, err)
			}
			return e.post("/v1/chat/completions", chatBody, hdr)
		}, header: map[string]string{"X-Should-Retry": "false"}, namesRun: true, status: 409, code: "idempotent_response_lost", sharedRun: true},
		{name: "409 already_running", send: func(e *errEnv) *http.Response {
			hdr := map[string]string{"X-Session-Id": "s-same", "X-Test-Gate": "sess"}
			first := e.inBackground("/v1/chat/completions", chatBody, hdr)
			e.gate.await(e.t, "sess", 1)
			resp := e.post("/v1/chat/completions", chatBody, hdr)
			e.gate.open("sess")
			<-first
			return resp
		}, header: map[string]string{"X-Should-Retry": "false"}, namesRun: true, status: 409, code: "already_running", retry: chat(chatBody, map[string]string{"X-Session-Id": "s-same"})},
		{name: "409 superseded", send: func(e *errEnv) *http.Response {
			first := e.inBackground("/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": "s-new", "X-Test-Gate": "never"})
			e.gate.await(e.t, "never", 1)
			sendOK(e.t, "newer", e.h.gw.URL, e.key, `{"model":"fake-gpt","messages":[{"role":"user","content":"newer"}]}`,
				map[string]string{"X-Session-Id": "s-new"})
			a := <-first
			sent, err := http.NewRequest(http.MethodPost, e.h.gw.URL+"/v1/chat/completions", nil)
			if err != nil {
				e.t.Fatal(err)
			}
			return &http.Response{StatusCode: a.status, Header: a.header, Body: io.NopCloser(strings.NewReader(string(a.body))), Request: sent}
		}, header: map[string]string{"X-Should-Retry": "false"}, status: 409, code: "superseded", forwarded: true, source: holds.SourceCancel, charged: true,
			retry: chat(`{"model":"fake-gpt","messages":[{"role":"user","content":"newest"}]}`, map[string]string{"X-Session-Id": "s-new"})},
		{name: "429 too_many_counts", send: func(e *errEnv) *http.Response {
			var bg []<-chan answer
			for range 16 {
				bg = append(bg, e.inBackground("/v1/messages/count_tokens", errMsgBody, map[string]string{"X-Test-Gate": "counts"}))
			}
			e.gate.await(e.t, "counts", 16)
			resp := e.post("/v1/messages/count_tokens", errMsgBody, nil)
			e.gate.open("counts")
			for _, c := range bg {
				<-c
			}
			return resp
		}, header: map[string]string{"Retry-After": "1"}, status: 429, code: "too_many_counts", anthropic: true, noRun: true,
			retry: ok("/v1/messages/count_tokens", errMsgBody, nil)},

		// After forwarding.
		{name: "upstream 400 passes through", send: chat(chatBody, map[string]string{fakellm.HeaderStatus: "400"}),
			status: 400, passthrough: true, forwarded: true, source: holds.SourceUpstreamError, retry: okChat},
		{name: "upstream 400 passes through, messages", send: ok("/v1/messages", errMsgBody, map[string]string{fakellm.HeaderStatus: "400"}),
			status: 400, passthrough: true, anthropic: true, forwarded: true, source: holds.SourceUpstreamError},
		{name: "upstream_refused", send: chat(chatBody, map[string]string{"X-Test-Upstream": "big-error"}), status: 400, code: "upstream_refused",
			forwarded: true, source: holds.SourceUpstreamError},
		{name: "upstream_error", send: chat(chatBody, map[string]string{fakellm.HeaderStatus: "500"}), status: 502, code: "upstream_error",
			forwarded: true, source: holds.SourceUpstreamError, retry: okChat},
		{name: "upstream_error messages", send: ok("/v1/messages", errMsgBody, map[string]string{fakellm.HeaderStatus: "500"}), status: 502,
			code: "upstream_error", anthropic: true, forwarded: true, source: holds.SourceUpstreamError},
		{name: "upstream_error messages, idempotent", send: ok("/v1/messages", errMsgBody, map[string]string{"Idempotency-Key": "k-5xx", fakellm.HeaderStatus: "500"}),
			status: 502, code: "upstream_error", anthropic: true, forwarded: true, source: holds.SourceUpstreamError,
			retry: ok("/v1/messages", errMsgBody, map[string]string{"Idempotency-Key": "k-5xx"})},
		{name: "upstream_error messages, session", send: ok("/v1/messages", errMsgBody, map[string]string{"X-Session-Id": "s-5xx", fakellm.HeaderStatus: "500"}),
			status: 502, code: "upstream_error", anthropic: true, forwarded: true, source: holds.SourceUpstreamError,
			retry: ok("/v1/messages", errMsgBody, map[string]string{"X-Session-Id": "s-5xx"})},
		{name: "upstream_error web page", send: chat(chatBody, map[string]string{"X-Test-Upstream": "html"}), status: 502, code: "upstream_error",
			forwarded: true, source: holds.SourceUpstreamError, retry: okChat},
		{name: "upstream_auth_failed", send: chat(chatBody, map[string]string{fakellm.HeaderStatus: "401"}), header: map[string]string{"X-Should-Retry": "false"}, status: 502, code: "upstream_auth_failed",
			forwarded: true, source: holds.SourceUpstreamError},
		{name: "upstream_unreachable", send: chat(`{"model":"dead-gpt","messages":[{"role":"user","content":"hi"}]}`, nil), status: 502,
			code: "upstream_unreachable", forwarded: true, source: holds.SourceUpstreamError, retry: okChat},
		{name: "upstream_timeout", send: chat(streamBody, map[string]string{"X-Test-Gate": "late"}), status: 504, code: "upstream_timeout",
			header: noRetry, forwarded: true, source: holds.SourceUpstreamTimeout, charged: true, retry: okChat},
		{name: "upstream_timeout count_tokens", send: ok("/v1/messages/count_tokens", errMsgBody, map[string]string{"X-Test-Gate": "late"}),
			status: 504, code: "upstream_timeout", anthropic: true, noRun: true, retry: ok("/v1/messages/count_tokens", errMsgBody, nil)},
		{name: "upstream gone before its headers", send: chat(chatBody, map[string]string{fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"}),
			status: 502, code: "upstream_unreachable", forwarded: true, source: holds.SourceUpstreamError, retry: okChat},
		// An answer with nothing in it is none: the caller is told it broke (an SDK cannot read
		// an empty body, and took an empty stream for an empty answer), charged as any broken
		// answer is, and an Idempotency-Key is not pinned to it for a day.
		{name: "upstream_broken empty answer", send: chat(chatBody, map[string]string{"X-Test-Upstream": "empty"}),
			header: noRetry, status: 502, code: "upstream_broken", forwarded: true, source: holds.SourceStreamError, charged: true, retry: okChat},
		{name: "upstream_broken empty stream", send: chat(streamBody, map[string]string{"X-Test-Upstream": "empty-stream"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceStreamError, charged: true, retry: okChat},
		{name: "upstream_broken empty stream, idempotent", send: chat(streamBody, map[string]string{"Idempotency-Key": "k-empty",
			"X-Test-Upstream": "empty-stream"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceStreamError, charged: true,
			retry: chat(streamBody, map[string]string{"Idempotency-Key": "k-empty"})},
		{name: "upstream_broken whole answer", send: chat(chatBody, map[string]string{"X-Test-Upstream": "cut"}),
			header: noRetry, status: 502, code: "upstream_broken", forwarded: true, source: holds.SourceStreamError, charged: true, retry: okChat},
		{name: "upstream_broken stream", send: chat(streamBody, map[string]string{fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceStreamError, charged: true, retry: okChat},
		{name: "upstream_broken stream, messages", send: ok("/v1/messages", `{"model":"claude-test","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceStreamError, charged: true},
		{name: "upstream_broken stream, responses", send: ok("/v1/responses", `{"model":"fake-gpt","stream":true,"input":"hi"}`,
			map[string]string{fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceStreamError, charged: true},
		{name: "upstream_timeout, idempotent", send: chat(chatBody, map[string]string{"Idempotency-Key": "k-late", "X-Test-Gate": "late"}),
			header: noRetry, status: 504, code: "upstream_timeout", forwarded: true, source: holds.SourceUpstreamTimeout, charged: true,
			retry: chat(chatBody, map[string]string{"Idempotency-Key": "k-late"})},
		{name: "upstream_timeout whole answer", send: chat(chatBody, map[string]string{"X-Test-Gate": "late"}), status: 504, code: "upstream_timeout",
			header: noRetry, forwarded: true, source: holds.SourceUpstreamTimeout, charged: true, retry: okChat},
		// A named run's call that fails leaves its run open, for the agent's retry: the run is
		// charged on settle what its calls used (here the retry's).
		{name: "upstream_error in a named run", send: chat(chatBody, map[string]string{"X-Run-Id": "agent-1", fakellm.HeaderStatus: "500"}),
			status: 502, code: "upstream_error", forwarded: true, source: holds.SourceClient, charged: true,
			cleanup: func(e *errEnv) { e.callThenSettle("agent-1") }},
		{name: "upstream_broken stream in a named run", send: chat(streamBody, map[string]string{"X-Run-Id": "agent-2",
			fakellm.HeaderChunks: "20", fakellm.HeaderDropAfter: "5"}),
			status: 200, code: "upstream_broken", streamed: true, forwarded: true, source: holds.SourceClient, charged: true,
			cleanup: func(e *errEnv) { e.callThenSettle("agent-2") }},
		{name: "upstream_response_too_large", send: chat(chatBody, map[string]string{fakellm.HeaderChunks: "1500"}), header: map[string]string{"X-Should-Retry": "false"}, status: 502,
			code: "upstream_response_too_large", forwarded: true, source: holds.SourceStreamError, charged: true, retry: okChat},
	}

	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			plan := tc.plan
			if plan == "" {
				plan = "standard"
			}
			u, key := h.user(plan)
			e := &errEnv{t: t, h: h, gate: gate, user: u, key: key}
			settled()
			logs.TakeAll()
			counted := h.metricSeries("tollgate_error_answers_total")
			resp := tc.send(e)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			runID := resp.Header.Get(proxy.RunIDHeader)
			checkErrorAnswer(t, tc, resp, body)
			if tc.forwarded != (runID != "") {
				t.Errorf("X-Tollgate-Run-Id %q; want one exactly when the call was forwarded (%v)", runID, tc.forwarded)
			}
			settled()
			lines := logs.TakeAll()
			logged := checkErrorLog(t, tc, lines, runID)
			checkRequestID(t, tc, resp, lines)
			checkErrorCounted(t, tc, counted, h.metricSeries("tollgate_error_answers_total"))
			if tc.cleanup != nil {
				tc.cleanup(e)
				settled()
			}
			checkErrorLeftovers(t, h, tc, u.ID, runID, logged)
			if tc.retry != nil {
				r := tc.retry(e)
				b := readAll(t, r.Body)
				r.Body.Close()
				want := tc.retryStatus
				if want == 0 {
					want = http.StatusOK
				}
				if r.StatusCode != want {
					t.Errorf("immediate correct retry: %d %s; want %d", r.StatusCode, b, want)
				}
				settled()
			}
			// Whatever the answer (a refusal, a replay, a duplicate, a broken stream), every
			// body it read is given back once its handler is done.
			h.waitRequestBodyBytes(func(n int64) bool { return n == 0 }, "every body given back after "+tc.name)
		})
	}
}

// Who holds bodies for whileBodiesHeld: the case's caller, two bodies of 60 KiB (its share,
// 128 KiB, nearly full), or two other callers, two each (the process's 256 KiB nearly full).
const (
	callerFull = iota
	processFull
)

// whileBodiesHeld sends a 20 KiB body for model to path while bodies held as who says fill
// the memory bound, and gives them back before it returns the answer.
func whileBodiesHeld(who int, path, model string) func(e *errEnv) *http.Response {
	return func(e *errEnv) *http.Response {
		defer holdBodies(e.t, e.h, bodyHolders(e, who), 60<<10)()
		return e.post(path, padded(model, 20<<10), nil)
	}
}

// bodyHolders is the keys whose callers hold bodies for whileBodiesHeld, one per body.
func bodyHolders(e *errEnv, who int) []string {
	if who == callerFull {
		return []string{e.key, e.key}
	}
	_, a := e.h.user("standard")
	_, b := e.h.user("standard")
	return []string{a, a, b, b}
}

// whileBodiesHeldChunked is whileBodiesHeld with the body sent chunked, without a
// Content-Length.
func whileBodiesHeldChunked(who int, path, model string) func(e *errEnv) *http.Response {
	return func(e *errEnv) *http.Response {
		defer holdBodies(e.t, e.h, bodyHolders(e, who), 60<<10)()
		// A reader of unknown length (ContentLength 0, Body set): net/http sends it chunked.
		req, err := http.NewRequest(http.MethodPost, e.h.gw.URL+path, io.MultiReader(strings.NewReader(padded(model, 20<<10))))
		if err != nil {
			e.t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		return resp
	}
}

// adminCall sends a request to the admin API with token.
func adminCall(method, path, body, token string) func(e *errEnv) *http.Response {
	return func(e *errEnv) *http.Response { return adminCallTo(e, e.h.gw.URL, method, path, body, token) }
}

func adminCallTo(e *errEnv, url, method, path, body, token string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// checkErrorAnswer checks an error answer's status, Content-Type and shape.
func checkErrorAnswer(t *testing.T, tc errRow, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != tc.status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body[:min(len(body), 500)])
	}
	for k, v := range tc.header {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if tc.streamed {
		if !strings.Contains(string(body), `"code":"`+tc.code+`"`) {
			t.Errorf("stream does not end with a %s error event: %s", tc.code, body)
		}
		return
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var e struct {
		Type  *string `json:"type"`
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
			RunID   string  `json:"run_id"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("answer is not JSON: %v: %s", err, body)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error.message or error.type missing: %s", body)
	}
	if tc.anthropic != (e.Type != nil && *e.Type == "error") {
		t.Errorf("Anthropic's shape (top-level type \"error\") is %v, want %v: %s", e.Type != nil, tc.anthropic, body)
	}
	if tc.namesRun && e.Error.RunID == "" {
		t.Errorf("error.run_id missing: %s", body)
	}
	if tc.passthrough {
		return
	}
	if e.Error.Code == nil || *e.Error.Code != tc.code {
		t.Errorf("error.code %v, want %s: %s", e.Error.Code, tc.code, body)
	}
}

// checkErrorCounted checks that the row's answer moved tollgate_error_answers_total by one,
// under its status and code, and no other series of it: an error the gateway wrote itself is
// counted once, where every one passes (writeError); an upstream's error passed on as it sent
// it, and an error event that ends a stream whose 200 went out, are not counted.
func checkErrorCounted(t *testing.T, tc errRow, before, after map[string]int64) {
	t.Helper()
	want := map[string]int64{}
	for series, n := range tc.alsoCounted {
		want[series] = n
	}
	if !tc.streamed && !tc.passthrough {
		want[fmt.Sprintf("code=%q,status=%q", tc.code, strconv.Itoa(tc.status))]++
	}
	for series, n := range after {
		if moved := n - before[series]; moved != want[series] {
			t.Errorf("tollgate_error_answers_total{%s} moved by %d, want %d", series, moved, want[series])
		}
	}
	for series := range want {
		if _, ok := after[series]; !ok {
			t.Errorf("tollgate_error_answers_total{%s} not counted", series)
		}
	}
}

// modelPaths are the routes whose every answer past the key check names its request
// (X-Tollgate-Request-Id), as README says: the model routes and the token counter.
var modelPaths = map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true,
	"/v1/responses": true, "/v1/messages": true, "/v1/messages/count_tokens": true}

// checkRequestID checks README's promise for a model route's error past the key check: the
// answer carries X-Tollgate-Request-Id, and a line at INFO or above carries it as request_id,
// so that a caller quoting it leads to the line that says why.
func checkRequestID(t *testing.T, tc errRow, resp *http.Response, lines []observer.LoggedEntry) {
	t.Helper()
	if resp.Request == nil {
		t.Fatalf("the row's answer names no request: its path is not known")
	}
	if tc.unknownCaller || !modelPaths[resp.Request.URL.Path] {
		return
	}
	id := resp.Header.Get(proxy.RequestIDHeader)
	if id == "" {
		t.Errorf("%s answered %d with no %s", resp.Request.URL.Path, resp.StatusCode, proxy.RequestIDHeader)
		return
	}
	if tc.unlogged != "" {
		return
	}
	for _, l := range lines {
		if l.ContextMap()["request_id"] == id {
			return
		}
	}
	var all []string
	for _, l := range lines {
		all = append(all, fmt.Sprintf("%s %q %v", l.Level, l.Message, l.ContextMap()))
	}
	t.Errorf("no log line carries request_id %s; lines:\n%s", id, strings.Join(all, "\n"))
}

// checkErrorLog checks the row's log line and returns the run id it names (or "").
func checkErrorLog(t *testing.T, tc errRow, lines []observer.LoggedEntry, runID string) string {
	t.Helper()
	var all []string
	for _, l := range lines {
		all = append(all, fmt.Sprintf("%s %q %v", l.Level, l.Message, l.ContextMap()))
	}
	if tc.unlogged != "" {
		return ""
	}
	for _, l := range lines {
		f := l.ContextMap()
		id, _ := f["run_id"].(string)
		if f["code"] == tc.code && f["status"] == int64(tc.status) {
			// README: INFO for the caller's mistakes (4xx, 499), WARN for the gateway's failures.
			if want := map[bool]zapcore.Level{true: zapcore.WarnLevel, false: zapcore.InfoLevel}[tc.status >= 500]; l.Level != want {
				t.Errorf("refusal logged at %s, want %s: %v", l.Level, want, f)
			}
		}
		switch {
		case runID != "":
			if id == runID {
				return id
			}
		case tc.unknownCaller || tc.noRun:
			// (An upstream's failure is logged as such, at WARN, without the caller's code.)
			if f["code"] == tc.code || (tc.status >= 500 && l.Level >= zapcore.WarnLevel && f["upstream"] != nil) ||
				(tc.logged != "" && l.Message == tc.logged) {
				return ""
			}
		case f["code"] == tc.code && f["status"] == int64(tc.status):
			if id == "" {
				t.Errorf("refusal line names no run: %v", f)
			}
			return id
		}
	}
	t.Errorf("no log line for %d %s (run %q); lines:\n%s", tc.status, tc.code, runID, strings.Join(all, "\n"))
	return ""
}

// checkErrorLeftovers checks what an error leaves: no live hold and nothing in flight for the
// user, no Redis key without an expiry, and what the run was charged.
func checkErrorLeftovers(t *testing.T, h *harness, tc errRow, userID uint64, runID, loggedRun string) {
	t.Helper()
	var live int
	if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND state <> 'settled'", userID); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		// (A live hold is also what counts as a call in flight against max_in_flight.)
		t.Errorf("%d holds queued or running after the error", live)
	}
	ctx := context.Background()
	iter := h.rdb.Scan(ctx, 0, h.keys.Prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		ttl, err := h.rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -1 {
			t.Errorf("Redis key %s has no expiry", k)
		}
		for _, id := range []string{runID, loggedRun} {
			if id != "" && !tc.sharedRun && k == h.keys.Lease(id) {
				t.Errorf("lease %s of the failed call left behind", k)
			}
		}
		if strings.HasPrefix(k, h.keys.Prefix+"dedup:{"+strconv.FormatUint(userID, 10)+"}") {
			// Given back when a call ends (endFingerprint): left, it makes the same request a
			// duplicate of a call that is over.
			t.Errorf("fingerprint %s left behind", k)
		}
	}
	if err := iter.Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if !tc.forwarded {
		if loggedRun == "" || tc.sharedRun {
			return
		}
		var charged int64
		err := h.db.Get(&charged, "SELECT charged_micro FROM run_holds WHERE run_id = ?", loggedRun)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if charged != 0 {
			t.Errorf("refused before forwarding, yet charged %d", charged)
		}
		return
	}
	var row struct {
		State   string         `db:"state"`
		Source  sql.NullString `db:"settle_source"`
		Charged int64          `db:"charged_micro"`
	}
	if err := h.db.Get(&row, "SELECT state, settle_source, charged_micro FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	if row.State != string(holds.StateSettled) || row.Source.String != tc.source || (row.Charged > 0) != tc.charged {
		t.Errorf("run settled %s/%s charged %d; want settled/%s charged>0=%v", row.State, row.Source.String, row.Charged, tc.source, tc.charged)
	}
}

// TestTokenCountCallerLeftIsLogged: a token count whose caller leaves while the upstream counts
// is answered 499 client_closed_request (README: "logged at INFO, apart from the gateway's own
// failures"), and, as for a model call, writes its line: it wrote none.
func TestTokenCountCallerLeftIsLogged(t *testing.T) {
	h, gate, logs := gatedObservedHarness(t, config.Upstream{Name: "gate-anthropic", Kind: "anthropic", Models: []string{"claude*"}})
	u, key := h.user("standard")
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/messages/count_tokens", strings.NewReader(errMsgBody))
	req.Header.Set("x-api-key", key)
	req.Header.Set("X-Test-Gate", "count")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	gate.await(t, "count", 1)
	leave()
	<-done
	const series = `tollgate_requests_total{code="499",route="/v1/messages/count_tokens"}`
	waitFor(t, "the count's 499 to be counted", func() bool { return h.metric(series) == "1" })
	for _, l := range logs.All() {
		if f := l.ContextMap(); f["code"] == "client_closed_request" && f["user_id"] == u.ID {
			return
		}
	}
	t.Fatalf("no line for the token count whose caller left")
}
