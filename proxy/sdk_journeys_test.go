package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// attempt is one HTTP exchange the SDK made.
type attempt struct {
	at         time.Time
	status     int
	retryAfter string
	should     string
	runID      string
}

type attemptLog struct {
	mu sync.Mutex
	a  []attempt
}

func (l *attemptLog) mw() option.Middleware {
	return func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		at := attempt{at: time.Now()}
		if res != nil {
			at.status, at.retryAfter, at.should = res.StatusCode, res.Header.Get("Retry-After"), res.Header.Get("X-Should-Retry")
			at.runID = res.Header.Get("X-Tollgate-Run-Id")
		}
		l.mu.Lock()
		l.a = append(l.a, at)
		l.mu.Unlock()
		return res, err
	}
}

func (l *attemptLog) all() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]attempt(nil), l.a...)
}

func sdkClient(h *harness, key string, log *attemptLog, opts ...option.RequestOption) openai.Client {
	base := []option.RequestOption{option.WithBaseURL(h.gw.URL + "/v1/"), option.WithAPIKey(key)}
	if log != nil {
		base = append(base, option.WithMiddleware(log.mw()))
	}
	return openai.NewClient(append(base, opts...)...)
}

var sdkParams = openai.ChatCompletionNewParams{Model: "fake-gpt",
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello to the billing team.")}}

// Upstream 500 -> gateway 502 upstream_error: SDK retries twice, every attempt settles at 0.
func TestSDKRetriesUpstream5xx(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	var log attemptLog
	c := sdkClient(h, key, &log, option.WithHeader(fakellm.HeaderStatus, "500"))
	_, err := c.Chat.Completions.New(context.Background(), sdkParams)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %T %v", err, err)
	}
	t.Logf("status=%d code=%q type=%q msg=%q", apiErr.StatusCode, apiErr.Code, apiErr.Type, apiErr.Message)
	if apiErr.StatusCode != 502 || apiErr.Code != "upstream_error" || apiErr.Type == "" || apiErr.Message == "" {
		t.Errorf("SDK parsed %+v", apiErr)
	}
	if n := len(log.all()); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	h.expectCharges(u.ID, nil, "upstream_error")
}

// 409 run_settled must not be retried by the SDK: the run stays settled.
func TestSDKRunSettledNotRetried(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	var log attemptLog
	c := sdkClient(h, key, &log, option.WithHeader("X-Run-Id", "agent-1"))
	if _, err := c.Chat.Completions.New(context.Background(), sdkParams); err != nil {
		t.Fatal(err)
	}
	h.settled()
	if st, b := h.settleRun(key, "agent-1"); st != 200 {
		t.Fatalf("settle: %d %s", st, b)
	}
	before := len(log.all())
	start := time.Now()
	_, err := c.Chat.Completions.New(context.Background(), sdkParams)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 409 || apiErr.Code != "run_settled" {
		t.Fatalf("err %v", err)
	}
	atts := log.all()[before:]
	t.Logf("%d attempts in %v, X-Should-Retry=%q", len(atts), time.Since(start), atts[0].should)
	if len(atts) != 1 {
		t.Errorf("SDK sent %d attempts for a settled run; want 1 (no retry)", len(atts))
	}
}

// The in-flight limit: the slot is freed soon after the SDK's first attempt is refused; the
// SDK should get in soon after, not wait the Retry-After of the oldest hold's expiry. The call
// in flight is held at the upstream until that refusal (a call held a fixed 300 ms could end
// before a slow machine's SDK attempt arrived, which was then served at once).
func TestSDKTooManyInFlightRetryAfter(t *testing.T) {
	gate := newGateUpstream()
	gateSrv := httptest.NewServer(gate)
	t.Cleanup(gateSrv.Close)
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 1
		c.Plans["standard"] = p
		c.Upstreams[0].BaseURL = gateSrv.URL
	})
	_, key := h.user("standard")
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"slow"}]}`,
			map[string]string{"X-Test-Gate": "slow"})
		resp.Body.Close()
	}()
	gate.await(t, "slow", 1)
	var opened sync.Once
	defer opened.Do(func() { gate.open("slow") })
	openOnRefusal := option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		res, err := next(req)
		if res != nil && res.StatusCode == http.StatusTooManyRequests {
			opened.Do(func() { gate.open("slow") }) // the call in flight ends: its slot is freed
		}
		return res, err
	})
	var log attemptLog
	c := sdkClient(h, key, &log, openOnRefusal)
	start := time.Now()
	_, err := c.Chat.Completions.New(context.Background(), sdkParams)
	el := time.Since(start)
	opened.Do(func() { gate.open("slow") })
	<-done
	for _, a := range log.all() {
		t.Logf("attempt status=%d Retry-After=%q", a.status, a.retryAfter)
	}
	if err != nil {
		t.Fatalf("after %v: %v", el, err)
	}
	if atts := log.all(); len(atts) < 2 || atts[0].status != http.StatusTooManyRequests || atts[0].retryAfter != "1" {
		t.Errorf("attempts %+v (after %v): want a 429 telling the SDK to come back in 1 s, then the call", atts, el)
	}
}

// Idempotency-Key set with option.WithHeader: a streamed call, then the same call again: the
// second is a replay; both SDK accumulators agree; one charge.
func TestSDKIdempotentStreamReplay(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	c := sdkClient(h, key, nil, option.WithHeader("Idempotency-Key", "k-1"), option.WithHeader(fakellm.HeaderChunks, "7"))
	for _, askUsage := range []bool{true} {
		p := sdkParams
		if askUsage {
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		var accs []openai.ChatCompletionAccumulator
		var runIDs []string
		for i := 0; i < 2; i++ {
			var raw *http.Response
			s := c.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&raw))
			var acc openai.ChatCompletionAccumulator
			for s.Next() {
				acc.AddChunk(s.Current())
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
			accs = append(accs, acc)
			runIDs = append(runIDs, raw.Header.Get("X-Tollgate-Run-Id")+" replayed="+raw.Header.Get("Idempotent-Replayed"))
		}
		t.Logf("runs %v; usage %+v / %+v", runIDs, accs[0].Usage.TotalTokens, accs[1].Usage.TotalTokens)
		if accs[0].Choices[0].Message.Content != accs[1].Choices[0].Message.Content || accs[0].Usage.TotalTokens != accs[1].Usage.TotalTokens || accs[0].Usage.TotalTokens == 0 {
			t.Errorf("replay differs: %q %+v vs %q %+v", accs[0].Choices[0].Message.Content, accs[0].Usage, accs[1].Choices[0].Message.Content, accs[1].Usage)
		}
	}
	runs := h.holdsOf(u.ID)
	if len(runs) != 1 || runs[0].ChargedMicro == 0 {
		t.Errorf("runs %+v", runs)
	}
}

// Embeddings through the SDK (float, and base64 as the Python SDK asks).
func TestSDKEmbeddings(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	c := sdkClient(h, key, nil)
	var ids []string
	for _, f := range []openai.EmbeddingNewParamsEncodingFormat{"", openai.EmbeddingNewParamsEncodingFormatBase64} {
		var raw *http.Response
		res, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "fake-gpt",
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("toll gate billing")}, EncodingFormat: f}, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		id := raw.Header.Get("X-Tollgate-Run-Id")
		r := h.run(u.ID, id)
		t.Logf("format %q: %d vectors, usage %+v, run in=%d out=%d charged=%d", f, len(res.Data), res.Usage, r.InTok, r.OutTok, r.ChargedMicro)
		if r.InTok != res.Usage.PromptTokens || r.OutTok != 0 {
			t.Errorf("charged %+v for usage %+v", r, res.Usage)
		}
		ids = append(ids, id)
	}
	h.expectCharges(u.ID, ids)
}

// Every gateway error the SDK can meet parses into *openai.Error with status, code, type and
// message; which ones the SDK retried.
func TestSDKErrorShapes(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.MaxBodyBytes = 4096 })
	u, key := h.user("standard")
	broke, brokeKey := h.user("standard")
	if _, err := h.db.Exec("UPDATE users SET allowance_micro = 0 WHERE id = ?", broke.ID); err != nil {
		t.Fatal(err)
	}
	_ = u
	big := make([]byte, 8000)
	for i := range big {
		big[i] = 'a'
	}
	cases := []struct {
		name   string
		key    string
		params openai.ChatCompletionNewParams
		opts   []option.RequestOption
		status int
		code   string
	}{
		{"bad key", "nope", sdkParams, nil, 401, "invalid_api_key"},
		{"unpriced", key, openai.ChatCompletionNewParams{Model: "no-such-model", Messages: sdkParams.Messages}, nil, 400, "model_not_priced"},
		{"no credits", brokeKey, sdkParams, nil, 402, "insufficient_credits"},
		{"too large", key, openai.ChatCompletionNewParams{Model: "fake-gpt", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(string(big))}}, nil, 413, "request_too_large"},
		{"bad run id", key, sdkParams, []option.RequestOption{option.WithHeader("X-Run-Id", "bad id!")}, 400, "invalid_run_id"},
		{"upstream 400", key, sdkParams, []option.RequestOption{option.WithHeader(fakellm.HeaderStatus, "400")}, 400, ""},
		{"upstream 429", key, sdkParams, []option.RequestOption{option.WithHeader(fakellm.HeaderStatus, "429")}, 429, ""},
		{"upstream 401", key, sdkParams, []option.RequestOption{option.WithHeader(fakellm.HeaderStatus, "401")}, 502, "upstream_auth_failed"},
	}
	// The gateway's own credentials refused: a retry cannot change that, so the SDK is told not
	// to (it retries a 502 twice otherwise, each attempt admitted and forwarded for nothing).
	once := map[string]bool{"upstream 401": true}
	for _, tc := range cases {
		var log attemptLog
		c := sdkClient(h, tc.key, &log, tc.opts...)
		_, err := c.Chat.Completions.New(context.Background(), tc.params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			t.Errorf("%s: err %T %v", tc.name, err, err)
			continue
		}
		t.Logf("%-12s status=%d code=%q type=%q attempts=%d msg=%q", tc.name, apiErr.StatusCode, apiErr.Code, apiErr.Type, len(log.all()), apiErr.Message)
		if apiErr.StatusCode != tc.status || (tc.code != "" && apiErr.Code != tc.code) || apiErr.Message == "" || apiErr.Type == "" {
			t.Errorf("%s: got %d %q", tc.name, apiErr.StatusCode, apiErr.Code)
		}
		if n := len(log.all()); once[tc.name] && n != 1 {
			t.Errorf("%s: the SDK made %d attempts, want 1 (X-Should-Retry: false)", tc.name, n)
		}
	}
	// 422: an Idempotency-Key reused with another body.
	c := sdkClient(h, key, nil, option.WithHeader("Idempotency-Key", "k-422"))
	if _, err := c.Chat.Completions.New(context.Background(), sdkParams); err != nil {
		t.Fatal(err)
	}
	var log attemptLog
	c = sdkClient(h, key, &log, option.WithHeader("Idempotency-Key", "k-422"))
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "fake-gpt", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("other")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 422 || apiErr.Code != "idempotency_key_reused" {
		t.Errorf("422: %v", err)
	} else {
		t.Logf("422 attempts=%d", len(log.all()))
	}
	// 404 run_not_found via a raw SDK GET.
	var out map[string]any
	gc := sdkClient(h, key, nil)
	err = gc.Get(context.Background(), "runs/nope", nil, &out)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "run_not_found" {
		t.Errorf("404: %v", err)
	}
}

// Mid-stream failures as the SDK sees them, and what each attempt is charged.
func TestSDKMidStream(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	for _, knob := range [][2]string{{fakellm.HeaderErrorAfter, "0"}, {fakellm.HeaderErrorAfter, "3"}, {fakellm.HeaderDropAfter, "0"}, {fakellm.HeaderDropAfter, "3"}} {
		var log attemptLog
		c := sdkClient(h, key, &log, option.WithHeader(knob[0], knob[1]), option.WithHeader(fakellm.HeaderChunks, "8"))
		var raw *http.Response
		p := sdkParams
		p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("mid " + knob[0] + knob[1])}
		s := c.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&raw))
		var acc openai.ChatCompletionAccumulator
		n := 0
		for s.Next() {
			acc.AddChunk(s.Current())
			n++
		}
		r := h.run(u.ID, raw.Header.Get("X-Tollgate-Run-Id"))
		t.Logf("chat %s=%s: %d chunks, attempts=%d, err=%v; run source=%s charged=%d est=%v", knob[0], knob[1], n, len(log.all()), s.Err(), r.SettleSource.String, r.ChargedMicro, r.Estimated)
		if s.Err() == nil {
			t.Errorf("SDK saw a clean end")
		}
		// responses
		var raw2 *http.Response
		rs := c.Responses.NewStreaming(context.Background(), responsesParams("mid "+knob[0]+knob[1]), option.WithResponseInto(&raw2))
		types := []string{}
		for rs.Next() {
			types = append(types, rs.Current().Type)
		}
		r2 := h.run(u.ID, raw2.Header.Get("X-Tollgate-Run-Id"))
		last := ""
		if len(types) > 0 {
			last = types[len(types)-1]
		}
		t.Logf("resp %s=%s: %d events last=%q err=%v; run source=%s charged=%d", knob[0], knob[1], len(types), last, rs.Err(), r2.SettleSource.String, r2.ChargedMicro)
	}
}

func responsesParams(s string) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "fake-gpt", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(s)}}
}

// The gateway's own error event at the end of a broken Responses stream must end the openai-go
// stream with an error, as the real OpenAI error event (nested "error", see
// testdata/usage/openai_responses_stream_error_then_failed.sse) and the chat format do:
// otherwise a truncated answer reads as a clean end.
func TestSDKResponsesStreamBreakIsAnError(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	c := sdkClient(h, key, nil, option.WithHeader(fakellm.HeaderDropAfter, "3"), option.WithHeader(fakellm.HeaderChunks, "8"))
	var raw *http.Response
	rs := c.Responses.NewStreaming(context.Background(), responsesParams("break me"), option.WithResponseInto(&raw))
	var text string
	completed := false
	for rs.Next() {
		ev := rs.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			completed = true
		}
	}
	r := h.run(u.ID, raw.Header.Get("X-Tollgate-Run-Id"))
	t.Logf("text %q completed=%v err=%v; run %s charged %d", text, completed, rs.Err(), r.SettleSource.String, r.ChargedMicro)
	if rs.Err() == nil {
		t.Errorf("the stream broke (run settled %s) but the SDK's stream.Err() is nil: the caller takes %q for a whole answer", r.SettleSource.String, text)
	}
}
