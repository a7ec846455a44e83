package proxy_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
)

// TestUsageAfterTheFinalEventReachesTheTally: a plain stream is tallied at its final event
// ([DONE]), with its fingerprint's release, before that event goes out. An upstream that goes
// on after it (within the 2 s it is given to close) and reports a larger usage is charged the
// larger: the tally must say so too, since it is what the reconciler charges if the process
// dies before the settlement commits.
func TestUsageAfterTheFinalEventReachesTheTally(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t) })
	u, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	r := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	if r.OutTok != 50 || r.CostMicro != fakeGPTCost(10, 50) {
		t.Fatalf("settled %d output tokens at %d µUSD, want the last report's 50 at %d", r.OutTok, r.CostMicro, fakeGPTCost(10, 50))
	}
	tallied, found, err := h.tally.Get(context.Background(), r.RunID)
	if err != nil || !found {
		t.Fatalf("no tally (%v)", err)
	}
	if tallied.CostMicro != r.CostMicro || tallied.Usage.Output != 50 || tallied.Calls != 1 {
		t.Fatalf("tally %+v, settled %d µUSD for 50 output tokens: the reconciler would charge another figure", tallied, r.CostMicro)
	}
}

// TestUsageAfterTheFinalEventClearsTheTallysEstimate: a stream with no usage before its final
// event is tallied then as an estimate; a report that comes after it replaces the estimate in
// the settlement, and the tally's estimated mark must go with it, or a run the reconciler
// settles from it is marked estimated though the provider said what it used.
func TestUsageAfterTheFinalEventClearsTheTallysEstimate(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = upstreamSending(t,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
			`[DONE]`,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`)
	})
	u, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	r := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	if r.OutTok != 50 || r.Estimated {
		t.Fatalf("settled %d output tokens, estimated=%v; want the report's 50, not estimated", r.OutTok, r.Estimated)
	}
	tallied, found, err := h.tally.Get(context.Background(), r.RunID)
	if err != nil || !found {
		t.Fatalf("no tally (%v)", err)
	}
	if tallied.EstimatedCalls != 0 || tallied.CostMicro != r.CostMicro || tallied.Calls != 1 {
		t.Fatalf("tally %+v; want the settled %d µUSD and no estimated call", tallied, r.CostMicro)
	}
}

// upstreamSending answers every call with a stream of the events given, as data lines.
func upstreamSending(t *testing.T, events ...string) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// usageAfterFinalUpstream answers every call with a stream that reports 5 output tokens, ends
// with [DONE], and then reports 50.
func usageAfterFinalUpstream(t *testing.T) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`,
			`[DONE]`,
			`{"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":50,"total_tokens":60}}`,
		} {
			_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// TestFailedPreAnswerTallyIsNotCorrected: when the pre-answer tally's write fails it may not
// have landed; a correction written at settlement on top of it would then be the whole tally —
// the difference alone (here 45 output tokens, no call) — which the reconciler would charge
// should the settlement fail too. No correction follows a failed write.
func TestFailedPreAnswerTallyIsNotCorrected(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = usageAfterFinalUpstream(t) })
	h.rdb.AddHook(&failTallyPipeline{})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	r := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	if r.CostMicro != fakeGPTCost(10, 50) {
		t.Fatalf("settled at %d µUSD, want %d", r.CostMicro, fakeGPTCost(10, 50))
	}
	tallied, found, err := h.tally.Get(context.Background(), r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if found && tallied.CostMicro != r.CostMicro {
		t.Fatalf("tally %+v after its first write failed: a partial figure (settled %d)", tallied, r.CostMicro)
	}
}

// failTallyPipeline fails, without sending it, every MULTI/EXEC that writes a tally with a
// fingerprint's release (the pre-answer tally); a correction alone goes through.
type failTallyPipeline struct{}

func (failTallyPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (failTallyPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (failTallyPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, 0, len(cmds))
		for _, c := range cmds {
			names = append(names, c.Name())
		}
		// The tally's script and the fingerprint's.
		if countEvals(names) >= 2 {
			err := errors.New("tally write refused by the test")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}
