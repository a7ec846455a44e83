package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// TestServerTaskAnswersOfABatchAreCharged: llama.cpp's server before it merged a batch's
// answers into one (builds of 2025 up to its n_cmpl support) answered a /v1/completions batch of
// several prompts, not streamed, with a JSON array of whole answers, one a prompt's task, each
// with its own choice and usage (handle_completions_impl: "multiple results (multitask)"). Read
// as no answer, the call was charged its prompts' estimate and none of its output: 0 output
// tokens where the server made 48. Every answer's report is charged, summed.
func TestServerTaskAnswersOfABatchAreCharged(t *testing.T) {
	answer := func(index int, prompt int64) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt","system_fingerprint":"b1","object":"text_completion",`+
			`"usage":{"completion_tokens":16,"prompt_tokens":%d,"total_tokens":%d},"id":"chatcmpl-l","timings":{"prompt_n":%d,"predicted_n":16}}`,
			strings.Repeat("w", 64), index, prompt, prompt+16, prompt)
	}
	batch := "[" + answer(0, 90) + "," + answer(1, 210) + "," + answer(2, 310) + "]"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, batch)
	}, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","max_tokens":16,"prompt":["` + strings.Repeat("x", 400) + `","` + strings.Repeat("y", 800) + `","` + strings.Repeat("z", 1200) + `"]}`
	status, out, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
	if status != 200 || string(out) != batch {
		t.Fatalf("status %d: %s, want the answer relayed as sent", status, out)
	}
	if run.SettleSource.String != holds.SourceComplete || run.InTok != 90+210+310 || run.OutTok != 3*16 || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 610 in and 48 out (every answer's report, summed), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
	}
}

// TestServerTaskAnswersOfAnOversizedBatchAreCharged: the same array of whole answers too large to
// relay (past max_response_bytes) is read past for the report at its end, which is its last
// answer's alone: a batch of three prompts was charged the last prompt's task, 310 in and 2 000
// out (20 775 µUSD at fake-gpt's prices), where the server made 610 in and 6 000 out (61 525
// µUSD). Every answer's report, read as it went by, is charged, summed, as read whole.
func TestServerTaskAnswersOfAnOversizedBatchAreCharged(t *testing.T) {
	answer := func(index int, prompt int64) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt","system_fingerprint":"b4800-1a2b3c4","object":"text_completion",`+
			`"usage":{"completion_tokens":2000,"prompt_tokens":%d,"total_tokens":%d},"id":"cmpl-l","timings":{"prompt_n":%d,"prompt_ms":1.5,"predicted_n":2000,"predicted_ms":3.1}}`,
			strings.Repeat("word ", 2000), index, prompt, prompt+2000, prompt)
	}
	batch := "[" + answer(0, 90) + "," + answer(1, 210) + "," + answer(2, 310) + "]"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, batch)
	}, func(c *config.Config) { c.Limits.MaxResponseBytes = 16 << 10 })
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","max_tokens":2000,"prompt":["` + strings.Repeat("x", 400) + `","` + strings.Repeat("y", 800) + `","` + strings.Repeat("z", 1200) + `"]}`
	status, out, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
	if status != http.StatusBadGateway || errorCode(t, out) != "upstream_response_too_large" {
		t.Fatalf("status %d: %s, want 502 upstream_response_too_large", status, out)
	}
	if run.InTok != 90+210+310 || run.OutTok != 3*2000 || !run.Estimated || run.CostMicro != fakeGPTCost(610, 6000) {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v cost %d µUSD, want 610 in and 6000 out (every answer's report, summed), estimated, %d µUSD",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, run.CostMicro, fakeGPTCost(610, 6000))
	}
}

// TestBrokenServerTaskAnswersOfABatchAreChargedTheOutputRead: the same array of whole answers
// broken partway — its connection dropped before the Content-Length it gave or the last chunk,
// or closed on a body the close delimits — was charged nothing of its output (read as no JSON
// object, none of its text counted), or, delimited by the close, relayed as whole and charged
// its answers' reports as read, the last one's cut mid-number (prompt_tokens 3 of 310). It is
// charged as any answer broken there: the prompts' estimate and the text read, estimated.
func TestBrokenServerTaskAnswersOfABatchAreChargedTheOutputRead(t *testing.T) {
	text := strings.Repeat("word ", 40)
	answer := func(index int, prompt int64) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt","system_fingerprint":"b4800-1a2b3c4","object":"text_completion",`+
			`"usage":{"completion_tokens":16,"prompt_tokens":%d,"total_tokens":%d},"id":"cmpl-l","timings":{"prompt_n":%d,"predicted_n":16}}`,
			text, index, prompt, prompt+16, prompt)
	}
	batch := "[" + answer(0, 90) + "," + answer(1, 210) + "," + answer(2, 310) + "]"
	cut := strings.LastIndex(batch, `"prompt_tokens":310`) + len(`"prompt_tokens":3`)
	up := &cutUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "cut", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
	})
	body := `{"model":"fake-gpt","max_tokens":16,"prompt":["` + strings.Repeat("x", 400) + `","` + strings.Repeat("y", 800) + `","` + strings.Repeat("z", 1200) + `"]}`
	wantOut := metering.EstimateOutputTokens(int64(3 * len(text)))
	for _, delivery := range []string{"length", "chunked", "close"} {
		up.set(batch, cut, delivery)
		u, key := h.user("standard")
		status, out, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
		if status != http.StatusBadGateway {
			t.Errorf("%s: %d %.200s, want 502", delivery, status, out)
		}
		if run.SettleSource.String != holds.SourceStreamError || !run.Estimated || run.InTok < 600 || run.OutTok != wantOut {
			t.Errorf("%s: run source=%s estimated=%v in=%d out=%d; want stream_error, estimated, the prompts' estimate (600 or more) and %d out (the text read)",
				delivery, run.SettleSource.String, run.Estimated, run.InTok, run.OutTok, wantOut)
		}
	}
}
