package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// countUpstream is an Anthropic upstream whose token counter answers input_tokens and
// records what reached it; gate, when set, holds each count until it is closed.
type countUpstream struct {
	mu      sync.Mutex
	seen    []*http.Request
	bodies  []string
	arrived chan struct{}
	gate    chan struct{}
	status  int
}

func (u *countUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body strings.Builder
	_, _ = io.Copy(&body, r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, r)
	u.bodies = append(u.bodies, body.String())
	u.mu.Unlock()
	if u.arrived != nil {
		u.arrived <- struct{}{}
	}
	if u.gate != nil {
		<-u.gate
	}
	w.Header().Set("Content-Type", "application/json")
	if u.status != 0 {
		w.WriteHeader(u.status)
		_, _ = w.Write([]byte(`{"type":"error","error":{"type":"api_error","message":"down"}}`))
		return
	}
	_, _ = w.Write([]byte(`{"input_tokens":42}`))
}

// wait returns when a count has reached the upstream; it fails the test when none comes
// (the counts are refused, or never forwarded).
func (u *countUpstream) wait(t *testing.T) {
	t.Helper()
	select {
	case <-u.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("no token count reached the upstream")
	}
}

// anthropicAt sends c's Anthropic upstreams' calls to url (a test's upstream).
func anthropicAt(c *config.Config, url string) {
	for i := range c.Upstreams {
		if c.Upstreams[i].Kind == "anthropic" {
			c.Upstreams[i].BaseURL = url
		}
	}
}

// countHarness is a gateway whose Anthropic upstream is u, with the operator's key set.
func countHarness(t *testing.T, u *countUpstream) *harness {
	up := httptest.NewServer(u)
	t.Cleanup(up.Close)
	return newHarness(t, func(c *config.Config) {
		for i := range c.Upstreams {
			if c.Upstreams[i].Kind == "anthropic" {
				c.Upstreams[i].BaseURL, c.Upstreams[i].APIKey = up.URL, "sk-ant-operator"
			}
		}
	})
}

// TestCountTokensForwardedFreeOfCharge: Claude Code asks Anthropic's token counter
// (/v1/messages/count_tokens) every turn to manage its context window, with the SDK's
// x-api-key. The provider does not bill it: the gateway forwards it with the operator's key
// (not the caller's), its query and beta headers, and holds and charges nothing. It was 404.
func TestCountTokensForwardedFreeOfCharge(t *testing.T) {
	u := &countUpstream{}
	h := countHarness(t, u)
	_, key := h.user("standard")
	before := h.credits(key)
	c := anthropic.NewClient(aopt.WithBaseURL(h.gw.URL+"/"), aopt.WithAPIKey(key), aopt.WithMaxRetries(0))
	got, err := c.Beta.Messages.CountTokens(context.Background(), anthropic.BetaMessageCountTokensParams{
		Model:    "claude-test",
		Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("How long is this?"))},
		Betas:    []anthropic.AnthropicBeta{"token-counting-2024-11-01"},
	}, aopt.WithQuery("beta", "true")) // as Claude Code's SDK sends it
	if err != nil {
		t.Fatalf("count_tokens: %v", err)
	}
	if got.InputTokens != 42 {
		t.Fatalf("input_tokens %d, want the upstream's 42", got.InputTokens)
	}
	if len(u.seen) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(u.seen))
	}
	r := u.seen[0]
	if r.URL.Path != "/v1/messages/count_tokens" || r.URL.Query().Get("beta") != "true" {
		t.Errorf("upstream got %s, want /v1/messages/count_tokens?beta=true", r.URL)
	}
	if r.Header.Get("X-Api-Key") != "sk-ant-operator" || r.Header.Get("Anthropic-Beta") != "token-counting-2024-11-01" ||
		r.Header.Get("Anthropic-Version") == "" {
		t.Errorf("upstream headers %v: want the operator's key, the caller's beta and a version", r.Header)
	}
	if !strings.Contains(u.bodies[0], "How long is this?") {
		t.Errorf("upstream body %s, want the caller's", u.bodies[0])
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Errorf("%d holds for a token count, want none", all)
	}
	if after := h.credits(key); after != before {
		t.Errorf("credits %s after a token count, %s before: it is free", after, before)
	}
}

// credits is the caller's /v1/credits answer.
func (h *harness) credits(key string) string {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("credits: %d", resp.StatusCode)
	}
	return string(readAll(h.t, resp.Body))
}

// TestCountTokensRefusals: a token count is refused as a model call would be, before anything
// reaches the upstream — bad key, unpriced model, a model no Anthropic upstream serves,
// invalid JSON — in Anthropic's error shape; an upstream failure is 502.
func TestCountTokensRefusals(t *testing.T) {
	u := &countUpstream{}
	h := countHarness(t, u)
	_, key := h.user("standard")
	ids := map[string]bool{}
	for _, tc := range []struct {
		name, key, body string
		status          int
		errType         string
	}{
		{"bad key", "nope", `{"model":"claude-test","messages":[]}`, 401, "authentication_error"},
		{"unpriced", key, `{"model":"claude-unpriced-zzz","messages":[]}`, 400, "invalid_request_error"},
		{"not anthropic", key, `{"model":"fake-gpt","messages":[]}`, 400, "invalid_request_error"},
		{"invalid json", key, `{"model":`, 400, "invalid_request_error"},
		{"model after a repeated empty key", key, `{"model":"claude-test","":0,"":0,"messages":[],"model":"claude-unpriced-zzz"}`, 400, "invalid_request_error"},
	} {
		resp := h.post("", "/v1/messages/count_tokens", tc.body, map[string]string{"X-Api-Key": tc.key})
		body := readAll(t, resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		if resp.StatusCode != tc.status || e.Type != "error" || e.Error.Type != tc.errType || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want %d with an Anthropic %s", tc.name, resp.StatusCode, body, tc.status, tc.errType)
		}
		// Past the key check a refusal names its request, as a model call's does.
		id := resp.Header.Get(proxy.RequestIDHeader)
		if (tc.key == key && (id == "" || ids[id])) || (tc.key != key && id != "") {
			t.Errorf("%s: request id %q, want one of its own past the key check only", tc.name, id)
		}
		ids[id] = true
	}
	if len(u.seen) != 0 {
		t.Fatalf("upstream saw %d refused counts", len(u.seen))
	}
	u.status = http.StatusServiceUnavailable
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("upstream 503: %d, want 502", resp.StatusCode)
	}
}

// TestCountTokensBoundedPerUser: counts take no hold, so nothing else bounds how many one
// caller has in flight (Claude Code's editor extension sends dozens at start): past the
// bound a count is refused 429 with Retry-After, and another user is not.
func TestCountTokensBoundedPerUser(t *testing.T) {
	u := &countUpstream{arrived: make(chan struct{}, 64), gate: make(chan struct{})}
	h := countHarness(t, u)
	_, key := h.user("standard")
	const bound = 16
	var wg sync.WaitGroup
	statuses := make(chan int, bound)
	for range bound {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	for range bound {
		u.wait(t)
	}
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("count past the bound: %d (Retry-After %q), want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	_, otherKey := h.user("standard")
	other := make(chan int, 1)
	go func() {
		resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": otherKey})
		resp.Body.Close()
		other <- resp.StatusCode
	}()
	u.wait(t) // another user's count reached the upstream
	close(u.gate)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Errorf("a count within the bound: %d", s)
		}
	}
	if s := <-other; s != http.StatusOK {
		t.Errorf("another user's count: %d", s)
	}
}

// TestCountTokensRelaysOnlyACount: a token count is free because it answers a number. An
// upstream that answers the counter's path with anything else (a compatible server or proxy
// that serves every path under /v1/messages as a model call) must not hand the caller what
// it generated: the gateway charged nothing for it. The count itself, and the context
// management figure Anthropic's beta adds, still reach the caller.
func TestCountTokensRelaysOnlyACount(t *testing.T) {
	var answer string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		anthropicAt(c, up.URL)
	})
	_, key := h.user("standard")
	const story = "Once upon a time, a paid answer"
	for _, tc := range []struct {
		name, answer string
		status       int
		want         string // in the answer relayed
	}{
		{"a message", `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"` + story + `"}],
			"input_tokens":12,"usage":{"input_tokens":12,"output_tokens":900}}`, http.StatusOK, `"input_tokens":12`},
		{"a stream", "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: content_block_delta\ndata: {\"delta\":{\"text\":\"" + story + "\"}}\n\n",
			http.StatusBadGateway, ""},
		{"no count", `{"text":"` + story + `"}`, http.StatusBadGateway, ""},
		{"a count", `{"input_tokens":42}`, http.StatusOK, `"input_tokens":42`},
		{"context management", `{"context_management":{"original_input_tokens":50},"input_tokens":42}`, http.StatusOK, `"original_input_tokens":50`},
		// A count is a whole number of tokens, none below zero, in an answer of a count's size.
		{"a negative count", `{"input_tokens":-42}`, http.StatusBadGateway, ""},
		{"a fractional count", `{"input_tokens":4.2}`, http.StatusBadGateway, ""},
		{"two counts", `{"input_tokens":42}{"input_tokens":7}`, http.StatusBadGateway, ""},
		{"a count past the bound on its answer", `{"input_tokens":42}` + strings.Repeat(" ", 64<<10), http.StatusBadGateway, ""},
		// Within the bound, to its last byte, and a count of nothing, are counts.
		{"a count at the bound on its answer", `{"input_tokens":42}` + strings.Repeat(" ", 64<<10-len(`{"input_tokens":42}`)), http.StatusOK, `"input_tokens":42`},
		{"a count of none", `{"input_tokens":0}`, http.StatusOK, `"input_tokens":0`},
	} {
		answer = tc.answer
		resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"X-Api-Key": key})
		body := string(readAll(t, resp.Body))
		resp.Body.Close()
		if resp.StatusCode != tc.status || strings.Contains(body, story) || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s; want %d with %s and none of what the upstream generated", tc.name, resp.StatusCode, body, tc.status, tc.want)
		}
	}
}

// TestCountTokensHalfClosedCallerIsNotAnswered200: net/http takes a caller that half-closes
// its connection once its request is sent for one that left, and cancels the count, though
// that caller still reads. Left unanswered, the count went out as 200 with an empty body:
// Claude Code falls back on its own estimate only for a non-2xx, and read no count at all.
// It gets 499 client_closed_request, as a model call does.
func TestCountTokensHalfClosedCallerIsNotAnswered200(t *testing.T) {
	u := &countUpstream{arrived: make(chan struct{}, 1), gate: make(chan struct{})}
	h := countHarness(t, u)
	t.Cleanup(func() { close(u.gate) })
	_, key := h.user("standard")
	resp, answer := halfClosedRequest(t, h, "/v1/messages/count_tokens", "X-Api-Key: "+key, `{"model":"claude-test","messages":[]}`,
		func(func() (*http.Response, error)) *http.Response { u.wait(t); return nil })
	if resp.StatusCode != 499 || !strings.Contains(answer, "client_closed_request") {
		t.Fatalf("a half-closed caller's count got %d %q, want 499 client_closed_request", resp.StatusCode, answer)
	}
}

// TestCountTokensAnswerTooSlowIsATimeout: a token count's whole answer is bounded by
// limits.header_timeout. An upstream that sends the count's headers in time and then stalls
// in its body did not answer in time, as one that sends no headers: README, 504
// upstream_timeout (it was told 502 upstream_broken, a broken answer).
func TestCountTokensAnswerTooSlowIsATimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_to`)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Limits.HeaderTimeout = 300 * time.Millisecond
		anthropicAt(c, up.URL)
	})
	_, key := h.user("standard")
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"X-Api-Key": key})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	var e struct {
		Type  string                               `json:"type"`
		Error struct{ Type, Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusGatewayTimeout || e.Type != "error" ||
		e.Error.Type != "timeout_error" || e.Error.Code != "upstream_timeout" || e.Error.Message == "" {
		t.Fatalf("%d %s, want 504 upstream_timeout in Anthropic's shape (timeout_error)", resp.StatusCode, body)
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Fatalf("%d holds for a token count", all)
	}
}

// TestCountTokensCallerLeftDuringTheAnswerIs499: a caller that leaves (here: half-closes, so
// it still reads) while the count's answer is being read was answered 502 upstream_broken,
// counted and logged as the upstream's failure. README: 499 client_closed_request, the same as
// a caller that leaves before the count's headers came.
func TestCountTokensCallerLeftDuringTheAnswerIs499(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_to`)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes: the gateway gives up when its caller does
	}))
	t.Cleanup(up.Close)
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	headers := make(chan struct{}, 1)
	h := newHarnessOn(t, harnessSetup{transport: headersTransport{inner: inner, in: headers}}, func(c *config.Config) {
		anthropicAt(c, up.URL)
	})
	_, key := h.user("standard")
	// Half-closed once the gateway has the answer's headers and reads its body, which stalls.
	resp, answer := halfClosedRequest(t, h, "/v1/messages/count_tokens", "X-Api-Key: "+key, `{"model":"claude-test","messages":[]}`,
		onSignal(t, headers, "the count's answer"))
	if resp.StatusCode != 499 || !strings.Contains(answer, "client_closed_request") {
		t.Fatalf("a caller that left while its count's answer was read got %d %q, want 499 client_closed_request", resp.StatusCode, answer)
	}
}

// headersTransport tells in once inner has an answer's headers.
type headersTransport struct {
	inner http.RoundTripper
	in    chan<- struct{}
}

func (t headersTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.inner.RoundTrip(req)
	if err == nil {
		t.in <- struct{}{}
	}
	return resp, err
}

// TestCountTokensGatewayWordedAnswersKeepTheProviderRequestID: a token count the provider
// answered and the gateway then worded itself — the provider's 5xx (Anthropic's 529
// overloaded_error) as 502 upstream_error, an answer that is no count as 502 upstream_broken —
// lost the provider's request id (Request-Id, X-Request-Id), which a model call's every answer
// keeps, and its log line had no upstream_request_id: such a failure could not be traced at the
// provider. Both now carry it, as a model call's do.
func TestCountTokensGatewayWordedAnswersKeepTheProviderRequestID(t *testing.T) {
	for _, tc := range []struct {
		name, header, code string
		status             int
		answer             string
	}{
		{"overloaded", "Request-Id", "upstream_error", 529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
		{"no count", "X-Request-Id", "upstream_broken", http.StatusOK, `{"text":"no count here"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set(tc.header, "req_count_upstream_1")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.answer)
			}))
			t.Cleanup(up.Close)
			h := newHarness(t, func(c *config.Config) {
				anthropicAt(c, up.URL)
			})
			_, key := h.user("standard")
			resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
				map[string]string{"X-Api-Key": key})
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != tc.code {
				t.Fatalf("%d %s, want 502 %s", resp.StatusCode, body, tc.code)
			}
			if got := resp.Header.Get(tc.header); got != "req_count_upstream_1" {
				t.Errorf("%s %q, want the provider's req_count_upstream_1", tc.header, got)
			}
		})
	}
}

// TestCountTokensRefusedWhileDraining: once the drain began, a model call is refused 503
// shutting_down before anything is done, but a token count was still forwarded, spending the
// operator's quota at the provider for an answer the exiting process may cut. It is refused
// alike now, its line and metric naming the refusal, and nothing reaches the upstream.
func TestCountTokensRefusedWhileDraining(t *testing.T) {
	u := &countUpstream{}
	h := countHarness(t, u)
	_, key := h.user("standard")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"shutting_down"`) ||
		resp.Header.Get("Retry-After") != "1" || resp.Header.Get(proxy.RequestIDHeader) == "" {
		t.Fatalf("count while draining: %d %s (Retry-After %q), want 503 shutting_down with Retry-After: 1 and a request id",
			resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if len(u.seen) != 0 {
		t.Fatalf("upstream saw %d counts sent while draining", len(u.seen))
	}
	if got := h.metric(`tollgate_requests_total{code="503",route="/v1/messages/count_tokens"}`); got != "1" {
		t.Errorf("refused count counted %q, want 1", got)
	}
}

// TestCountTokensCutAtTheDrainDeadline: a graceful shutdown cuts, at its drain deadline, the
// calls still running (CutCalls), each told 503 shutting_down. A token count forwarded before
// the drain began was not cut: it ran on until its upstream answered or limits.header_timeout
// ended it, holding the listener's shutdown (and the process's exit) past the deadline, and
// its caller got no answer once the connection was closed under it. It is cut as a call is,
// answered 503 shutting_down with Retry-After: 1 (it was charged nothing), and the listener's
// shutdown returns.
func TestCountTokensCutAtTheDrainDeadline(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select { // a slow count: minutes, unless the gateway gives up on it
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"input_tokens":42}`)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) { anthropicAt(c, up.URL) })
	// Before the harness's cleanup, which waits for a count left running when the test fails.
	t.Cleanup(func() { close(release) })
	_, key := h.user("standard")

	counted := countInBackground(h, key)
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the count did not reach the upstream")
	}

	// As cmd/gateway stops: the listener's shutdown until the drain deadline (short here), then
	// the cut, then the listener's shutdown again, within a grace.
	sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer scancel()
	if err := h.gw.Config.Shutdown(sctx); err == nil {
		t.Fatal("the listener's shutdown returned with the count still running")
	}
	h.srv.CutCalls()
	shut := make(chan error, 1)
	go func() {
		gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer gcancel()
		shut <- h.gw.Config.Shutdown(gctx)
	}()
	var c countAnswer
	select {
	case c = <-counted:
	case <-time.After(10 * time.Second):
		t.Fatal("the count was not answered after the drain deadline cut the calls")
	}
	if c.err != nil || c.status != http.StatusServiceUnavailable || !strings.Contains(c.body, `"shutting_down"`) ||
		c.header.Get("Retry-After") != "1" || c.header.Get(proxy.RequestIDHeader) == "" {
		t.Errorf("count cut at the drain deadline: %d %q (Retry-After %q, err %v); want 503 shutting_down with Retry-After: 1 and a request id",
			c.status, c.body, c.header.Get("Retry-After"), c.err)
	}
	if strings.Contains(c.body, "charged") && !strings.Contains(c.body, "nothing is charged") {
		t.Errorf("count cut at the drain deadline told %q: a count is never charged", c.body)
	}
	// Its caller is told a token count was cut (errCountCut's cause), not a call.
	if !strings.Contains(c.body, "token count") {
		t.Errorf("count cut at the drain deadline told %q, want it named a token count", c.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("the listener's shutdown after the cut: %v, want it done", err)
	}
	// Read from the metrics themselves: the listener that served /metrics is shut.
	if got := testutil.ToFloat64(h.metrics.Requests.WithLabelValues("/v1/messages/count_tokens", "503")); got != 1 {
		t.Errorf("cut count counted %v times as 503, want 1", got)
	}
	if all, _ := h.holdCount(); all != 0 {
		t.Errorf("%d holds for a token count", all)
	}
}

// TestCountTokensCutWhileItsAnswerIsRead: the drain deadline's cut reaches a count whose
// upstream answer has begun and stalls in its body, a count (relayCount) or a refusal
// (relayUpstreamError) alike: answered 503 shutting_down with Retry-After: 1, counted once
// as 503, never as the caller's 499 or the upstream's 502/504, and told, as a count cut
// before its answer began is, that nothing is charged (it was told it was charged what it used).
func TestCountTokensCutWhileItsAnswerIsRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
	}{{"count", http.StatusOK}, {"refusal", 529}} {
		t.Run(tc.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, `{"input_to`)
				w.(http.Flusher).Flush()
				<-r.Context().Done() // the rest never comes
			}))
			t.Cleanup(up.Close)
			inner := &http.Transport{}
			t.Cleanup(inner.CloseIdleConnections)
			headers := make(chan struct{}, 1)
			h := newHarnessOn(t, harnessSetup{transport: headersTransport{inner: inner, in: headers}}, func(c *config.Config) {
				anthropicAt(c, up.URL)
			})
			_, key := h.user("standard")
			answered := countInBackground(h, key)
			select {
			case <-headers:
			case <-time.After(10 * time.Second):
				t.Fatal("the count's answer did not begin")
			}
			sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer scancel()
			_ = h.gw.Config.Shutdown(sctx)
			h.srv.CutCalls()
			var a countAnswer
			select {
			case a = <-answered:
			case <-time.After(10 * time.Second):
				t.Fatal("the count was not answered after the drain deadline cut it")
			}
			if a.err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"shutting_down"`) || a.header.Get("Retry-After") != "1" {
				t.Errorf("count cut while its answer was read: %d %q (Retry-After %q, err %v); want 503 shutting_down, Retry-After: 1",
					a.status, a.body, a.header.Get("Retry-After"), a.err)
			}
			if strings.Contains(a.body, "charged") && !strings.Contains(a.body, "nothing is charged") {
				t.Errorf("count cut while its answer was read told %q: a count is never charged", a.body)
			}
			for code, want := range map[string]float64{"503": 1, "499": 0, "502": 0, "504": 0} {
				if got := testutil.ToFloat64(h.metrics.Requests.WithLabelValues("/v1/messages/count_tokens", code)); got != want {
					t.Errorf("cut count counted %v times as %s, want %v", got, code, want)
				}
			}
		})
	}
}

// countAnswer is what a caller of /v1/messages/count_tokens saw.
type countAnswer struct {
	status int
	header http.Header
	body   string
	err    error
}

// countInBackground sends a token count with key to h's gateway; its answer comes on the channel.
func countInBackground(h *harness, key string) <-chan countAnswer {
	answered := make(chan countAnswer, 1)
	go func() {
		req := h.newRequest("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"X-Api-Key": key})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- countAnswer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answered <- countAnswer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	}()
	return answered
}

// TestCountTokensBoundFreesOneSlotACount: a count that ends gives its caller back one slot
// under the bound on counts in flight, and only one. Each count that ended keeping its slot
// would leave a caller refused 429 for good after 16 counts (Claude Code asks one every turn);
// one freeing them all would let it run twice the bound at the operator's provider quota.
func TestCountTokensBoundFreesOneSlotACount(t *testing.T) {
	u := &countUpstream{arrived: make(chan struct{}, 64), gate: make(chan struct{})}
	h := countHarness(t, u)
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(u.gate) }) }
	t.Cleanup(releaseAll) // before the upstream's close, which waits for the counts it holds
	_, key := h.user("standard")
	count := func() int {
		resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
		readAll(t, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	const bound = 16
	statuses := make(chan int, bound+1)
	inBackground := func() { go func() { statuses <- count() }() }
	for range bound {
		inBackground()
	}
	for range bound {
		u.wait(t)
	}
	u.gate <- struct{}{} // one count answered
	if s := <-statuses; s != http.StatusOK {
		t.Fatalf("the count let go: %d, want 200", s)
	}
	inBackground() // in the slot it gave back
	u.wait(t)
	if s := count(); s != http.StatusTooManyRequests {
		t.Errorf("a count past the bound once one had ended and another taken its slot: %d, want 429", s)
	}
	releaseAll()
	for range bound {
		if s := <-statuses; s != http.StatusOK {
			t.Errorf("a count within the bound: %d, want 200", s)
		}
	}
}

// TestCountTokensCompressedBodyIsRefused: a token count's body is refused with the
// Content-Encoding a model call's is refused for (415 unsupported_content_encoding, in
// Anthropic's shape), before anything reaches the upstream: the gateway reads the body as
// plain JSON to pick the upstream, and forwards it without the label.
func TestCountTokensCompressedBodyIsRefused(t *testing.T) {
	u := &countUpstream{}
	h := countHarness(t, u)
	_, key := h.user("standard")
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`,
		map[string]string{"X-Api-Key": key, "Content-Encoding": "gzip"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	var e struct {
		Type  string                               `json:"type"`
		Error struct{ Type, Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType || e.Type != "error" ||
		e.Error.Type != "invalid_request_error" || !strings.Contains(string(body), "unsupported_content_encoding") {
		t.Errorf("%d %s, want 415 unsupported_content_encoding in Anthropic's shape", resp.StatusCode, body)
	}
	if len(u.seen) != 0 {
		t.Errorf("upstream saw %d counts sent with Content-Encoding", len(u.seen))
	}
}

// TestCountTokensUpstreamUnreachableIs502: a count whose upstream cannot be reached (nothing
// listens there) is answered 502 upstream_unreachable, as a model call is: the gateway's
// neighbour failed, not the gateway (503 would read as the gateway shutting down or full).
func TestCountTokensUpstreamUnreachableIs502(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	h := newHarness(t, func(c *config.Config) { anthropicAt(c, gone.URL) })
	_, key := h.user("standard")
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_unreachable" {
		t.Fatalf("%d %s, want 502 upstream_unreachable", resp.StatusCode, body)
	}
	if got := h.metric(`tollgate_requests_total{code="502",route="/v1/messages/count_tokens"}`); got != "1" {
		t.Errorf("unreachable count counted %q times as 502, want 1", got)
	}
}

// TestCountTokensKeyEchoInAHeaderIsRedacted: an upstream (a router or debugging proxy in front
// of Anthropic) that quotes the x-api-key it was sent in a header of its answer had the
// operator's key relayed with a count's headers, a count or a refusal: it is redacted there as
// in a model call's answer (TestUpstreamKeyEchoInAHeaderIsRedacted).
func TestCountTokensKeyEchoInAHeaderIsRedacted(t *testing.T) {
	const opKey = "sk-ant-api03-operatorsecret0123456789"
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Echo-Api-Key", r.Header.Get("X-Api-Key"))
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("X-Echo-Status") == "400" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad request"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"input_tokens":42}`)
	}))
	t.Cleanup(echo.Close)
	h := newHarness(t, func(c *config.Config) {
		for i := range c.Upstreams {
			if c.Upstreams[i].Kind == "anthropic" {
				c.Upstreams[i].BaseURL, c.Upstreams[i].APIKey = echo.URL, opKey
			}
		}
	})
	_, key := h.user("standard")
	for _, st := range []string{"200", "400"} {
		resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`,
			map[string]string{"X-Api-Key": key, "X-Echo-Status": st})
		readAll(t, resp.Body)
		resp.Body.Close()
		if st == "200" && resp.StatusCode != http.StatusOK {
			t.Errorf("count: %d, want 200", resp.StatusCode)
		}
		for k, vv := range resp.Header {
			if strings.Contains(strings.Join(vv, " "), "operatorsecret") {
				t.Errorf("%s (%d): header %s names the operator's key: %q", st, resp.StatusCode, k, vv)
			}
		}
	}
}

// TestCountTokensRebuiltCountCarriesNoEncoding: the count relayed is rebuilt as plain JSON
// (countOf), so it goes without the Content-Encoding its upstream's answer was labelled with.
// A proxy on the way that decoded the answer and kept the label (here br, which the gateway
// does not decode: the body read is plain) had the label relayed with the plain count, and
// the caller's client, decoding it as br, read no count.
func TestCountTokensRebuiltCountCarriesNoEncoding(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "br")
		_, _ = io.WriteString(w, `{"input_tokens":42}`)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) { anthropicAt(c, up.URL) })
	_, key := h.user("standard")
	resp := h.post("", "/v1/messages/count_tokens", `{"model":"claude-test","messages":[]}`, map[string]string{"X-Api-Key": key})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != `{"input_tokens":42}` || resp.Header.Get("Content-Encoding") != "" {
		t.Fatalf("%d %s (Content-Encoding %q), want 200 with the count in plain JSON and no Content-Encoding",
			resp.StatusCode, body, resp.Header.Get("Content-Encoding"))
	}
}
