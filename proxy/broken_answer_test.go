package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// brokenAnswerFormats are a non-streamed answer of each format whose text is words, cut
// anywhere in it: what comes before the text, and the request that asks for it.
var brokenAnswerFormats = []struct{ name, path, request, head, tail string }{
	{"chat", "/v1/chat/completions", chatBody,
		`{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"`,
		`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`},
	{"anthropic", "/v1/messages", `{"model":"claude-test","max_tokens":64000,"messages":[{"role":"user","content":"Say hello."}]}`,
		`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"`,
		`"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":5}}`},
	{"responses", "/v1/responses", `{"model":"fake-gpt","input":"Say hello."}`,
		`{"id":"resp_1","object":"response","status":"completed","model":"fake-gpt","output":[{"type":"message","id":"m","role":"assistant",` +
			`"content":[{"type":"output_text","text":"`,
		`","annotations":[]}]}],"usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15}}`},
}

// cutUpstream answers with the first send bytes of body, then closes the connection: the
// body delimited by a Content-Length of the whole ("length"), chunked ("chunked", no last
// chunk), or by the connection's close ("close", which reads as a clean end).
type cutUpstream struct {
	mu       sync.Mutex
	body     string
	send     int
	delivery string
}

func (u *cutUpstream) set(body string, send int, delivery string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.body, u.send, u.delivery = body, send, delivery
}

func (u *cutUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	body, send, delivery := u.body, u.send, u.delivery
	u.mu.Unlock()
	conn, bw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	sent := body[:send]
	switch delivery {
	case "length":
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), sent)
	case "chunked":
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		for b := sent; len(b) > 0; {
			n := min(len(b), 16<<10)
			fmt.Fprintf(bw, "%x\r\n%s\r\n", n, b[:n])
			b = b[n:]
		}
	case "close":
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n%s", sent)
	}
	_ = bw.Flush()
}

// TestBrokenNonStreamedAnswerIsChargedTheOutputRead: a non-streamed answer whose body breaks
// partway (the upstream's connection drops before the Content-Length it gave, or before the
// last chunk, or it closes a body the close delimits) was charged its prompt's estimate
// alone, with no output, where the provider made the output it sent and bills it, and a
// stream broken at the same point is charged the output it relayed. It is charged as that
// stream is now: stream_error, estimated, the text read priced at the output price, within
// the cap, once (the day ledger holds the run's charge) — an answer of a size to relay or one
// too large to (its Content-Length past max_response_bytes, or read past it), broken within
// what is read first of one (its head) or after it, in every format.
func TestBrokenNonStreamedAnswerIsChargedTheOutputRead(t *testing.T) {
	up := &cutUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	gateway := func(limit int64) *harness {
		return newHarness(t, func(c *config.Config) {
			c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}},
				{Name: "cut", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
			c.Limits.MaxResponseBytes = limit
		})
	}
	const small = 32 << 10
	gateways := map[string]*harness{"relayable": gateway(32 << 20), "too large": gateway(small)}
	words := strings.Repeat("words ", 100_000)
	for _, tc := range []struct {
		size string
		text int // bytes of text sent before the break
	}{
		{"relayable", 0},
		{"relayable", 40_000},
		{"relayable", 400_000}, // 100 000 tokens: 1 USD, past the cap of 0.5
		{"too large", 48_000},  // broken within the 64 KiB read first
		{"too large", 100_000}, // broken past it, within 4 × max_response_bytes
	} {
		h := gateways[tc.size]
		for _, f := range brokenAnswerFormats {
			body := f.head + words[:tc.text+1000] + f.tail
			for _, delivery := range []string{"length", "chunked", "close"} {
				name := fmt.Sprintf("%s %d bytes of text, %s, %s", tc.size, tc.text, f.name, delivery)
				up.set(body, len(f.head)+tc.text, delivery)
				u, key := h.user("standard")
				status, answer, run := h.postRun(u.ID, key, f.path, f.request, nil)
				wantOut := metering.EstimateOutputTokens(int64(tc.text))
				if status != http.StatusBadGateway {
					t.Errorf("%s: %d %.200s, want 502", name, status, answer)
				}
				if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.InTok <= 0 || run.OutTok != wantOut ||
					run.CostMicro != fakeGPTCost(run.InTok, wantOut) || run.DiscountBP != 0 || run.ChargedMicro != min(run.CostMicro, run.CapMicro) {
					t.Errorf("%s: run source=%s estimated=%v in=%d out=%d cost=%d charged=%d cap=%d; want stream_error, estimated, "+
						"%d output tokens (the text read), cost %d, charged within the cap",
						name, run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, run.CostMicro, run.ChargedMicro, run.CapMicro,
						wantOut, fakeGPTCost(run.InTok, wantOut))
				}
				var used, runs int64
				if err := h.db.QueryRow("SELECT COALESCE(SUM(used_micro), 0), COALESCE(SUM(run_count), 0) FROM usage_days WHERE user_id = ?",
					u.ID).Scan(&used, &runs); err != nil {
					t.Fatal(err)
				}
				if used != run.ChargedMicro || runs != 1 {
					t.Errorf("%s: the day ledger holds %d µUSD over %d runs, want the run's charge, %d, once", name, used, runs, run.ChargedMicro)
				}
			}
		}
	}
}

// leavingBody is an upstream answer's body that tells, once the gateway has read want bytes
// of it, that it did (read).
type leavingBody struct {
	io.ReadCloser
	want, got int
	read      chan struct{}
}

func (b *leavingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.got < b.want && b.got+n >= b.want {
		close(b.read)
	}
	b.got += n
	return n, err
}

// leavingTransport wraps the answer's body in a leavingBody.
type leavingTransport struct {
	inner http.RoundTripper
	want  int
	read  chan struct{}
}

func (t leavingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.inner.RoundTrip(req)
	if err == nil {
		resp.Body = &leavingBody{ReadCloser: resp.Body, want: t.want, read: t.read}
	}
	return resp, err
}

// TestCallerLeavingWhileANonStreamedAnswerIsReadPaysItsOutputRead: a caller that leaves while
// the gateway reads a non-streamed answer (before any of it is relayed) cuts the upstream call
// with it; the provider made the output it had sent, and bills it (a non-streamed answer is
// made before it is sent). It is charged as a caller that leaves a stream is: cancel,
// estimated, the output read so far. It was charged its prompt's estimate alone.
func TestCallerLeavingWhileANonStreamedAnswerIsReadPaysItsOutputRead(t *testing.T) {
	const text = 40_000
	f := brokenAnswerFormats[0]
	body := f.head + strings.Repeat("words ", text/6+1000) + f.tail
	sent := len(f.head) + text
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		bw := bufio.NewWriter(w)
		_, _ = bw.WriteString(body[:sent])
		_ = bw.Flush()
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes: the gateway cuts the call when its caller leaves
	}))
	t.Cleanup(up.Close)
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	read := make(chan struct{})
	h := newHarnessOn(t, harnessSetup{transport: leavingTransport{inner: inner, want: sent, read: read}}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "slow", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
	})
	u, key := h.user("standard")
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(h.newRequest(key, f.path, f.request, nil).WithContext(ctx))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-read // the gateway has read the text sent
	leave()
	if err := <-done; err == nil {
		t.Fatal("answered, want the request cancelled")
	}
	var runID string
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	h.waitSettled(runID, 30*time.Second, "its caller left")
	run := h.run(u.ID, runID)
	wantOut := metering.EstimateOutputTokens(text)
	if run.SettleSource.String != holds.SourceCancel || !run.Estimated || run.InTok <= 0 || run.OutTok != wantOut ||
		run.ChargedMicro != fakeGPTCost(run.InTok, wantOut) {
		t.Fatalf("run source=%s estimated=%v in=%d out=%d charged=%d; want cancel, estimated, %d output tokens (the text read), charged %d",
			run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, run.ChargedMicro, wantOut, fakeGPTCost(run.InTok, wantOut))
	}
}

// TestNonStreamedAnswerOutOfTimePaysItsOutputRead: a non-streamed answer whose time ran out
// while it was read (upstream_timeout) is charged its prompt's estimate and that of the output
// it had sent, as a stream that times out midway is; it was charged the prompt's alone.
func TestNonStreamedAnswerOutOfTimePaysItsOutputRead(t *testing.T) {
	const text = 40_000
	f := brokenAnswerFormats[0]
	// The timeout runs from before the request is written, and the 40 kB must be read before
	// it: at 1 s a loaded machine that had not read them all when it ran out charged the
	// output read so far, or none.
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, f.head+strings.Repeat("w", text))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}, func(c *config.Config) { c.Limits.UpstreamTimeout = timeoutAfterTheRequest })
	u, key := h.user("standard")
	status, answer, run := h.postRun(u.ID, key, f.path, f.request, nil)
	if status != http.StatusGatewayTimeout || errorCode(t, answer) != "upstream_timeout" {
		t.Fatalf("%d %s, want 504 upstream_timeout", status, answer)
	}
	wantOut := metering.EstimateOutputTokens(text)
	if run.SettleSource.String != holds.SourceUpstreamTimeout || !run.Estimated || run.InTok <= 0 || run.OutTok != wantOut ||
		run.ChargedMicro != fakeGPTCost(run.InTok, wantOut) {
		t.Fatalf("run source=%s estimated=%v in=%d out=%d charged=%d; want upstream_timeout, estimated, %d output tokens, charged %d",
			run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, run.ChargedMicro, wantOut, fakeGPTCost(run.InTok, wantOut))
	}
}

// TestCloseDelimitedAnswerTooLargeCutShortIsNoReport: an answer too large to relay whose body
// the connection's close delimits, cut before its JSON ends (which reads as a clean end), was
// read as a whole answer: a "usage" object in what was read — here in an Anthropic tool
// input, raw JSON the caller's schema shapes — was taken for its report and the call charged
// 1 token in and 1 out, and the value being read when it was cut (the tool input) counted
// nothing. It is charged as the same answer broken there with a Content-Length is: the
// prompt's estimate and the output read, stream_error.
func TestCloseDelimitedAnswerTooLargeCutShortIsNoReport(t *testing.T) {
	up := &cutUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}}}
		c.Limits.MaxResponseBytes = 32 << 10
	})
	head := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"tool_use","id":"t","name":"f","input":`
	input := `{"usage":{"input_tokens":1,"output_tokens":1},"pad":"` + strings.Repeat("y", 100_000) + `"}`
	body := head + input + `}],"stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}}`
	request := `{"model":"claude-test","max_tokens":64000,"messages":[{"role":"user","content":"Say hello."}]}`
	for _, delivery := range []string{"close", "length"} {
		for _, read := range []int{60, len(input) - 10} {
			up.set(body, len(head)+read, delivery)
			u, key := h.user("standard")
			status, answer, run := h.postRun(u.ID, key, "/v1/messages", request, nil)
			wantOut := metering.EstimateOutputTokens(int64(read))
			if status != http.StatusBadGateway || run.SettleSource.String != holds.SourceStreamError || !run.Estimated ||
				run.OutTok != wantOut || run.ChargedMicro != fakeGPTCost(run.InTok, wantOut) {
				t.Errorf("%s, %d bytes of the input: %d %.100s; run source=%s estimated=%v in=%d out=%d charged=%d; "+
					"want 502, stream_error, estimated, %d output tokens (the input read), charged %d",
					delivery, read, status, answer, run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, run.ChargedMicro,
					wantOut, fakeGPTCost(run.InTok, wantOut))
			}
		}
	}
}
