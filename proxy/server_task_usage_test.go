package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// TestServerTaskUsageOfEachChoiceIsCharged: llama.cpp's server runs each of a call's n answers
// as a task of its own, and streamed, ends each with its finishing chunk and a usage chunk,
// choices empty, of that answer's tokens alone. A whole stream with n = 2 was charged its last
// report, one answer: 300 output tokens where the server made 700. Each answer is charged.
func TestServerTaskUsageOfEachChoiceIsCharged(t *testing.T) {
	chunk := func(index int) string {
		return fmt.Sprintf("data: {\"choices\":[{\"finish_reason\":null,\"index\":%d,\"delta\":{\"content\":\"%s\"}}],\"id\":\"c\",\"model\":\"fake-gpt\",\"object\":\"chat.completion.chunk\"}\n\n",
			index, strings.Repeat("w", 40))
	}
	final := func(index int, completion int64) string {
		return fmt.Sprintf("data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":%d,\"delta\":{}}],\"id\":\"c\",\"model\":\"fake-gpt\",\"object\":\"chat.completion.chunk\"}\n\n"+
			"data: {\"choices\":[],\"id\":\"c\",\"model\":\"fake-gpt\",\"object\":\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":%d,\"prompt_tokens\":1000,\"total_tokens\":%d}}\n\n",
			index, completion, 1000+completion)
	}
	stream := chunk(0) + chunk(1) + final(1, 300) + chunk(0) + final(0, 400) + "data: [DONE]\n\n"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	}, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","stream":true,"n":2,"messages":[{"role":"user","content":"two answers, please"}]}`
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", body, nil)
	if status != 200 || !strings.Contains(string(answer), "[DONE]") {
		t.Fatalf("status %d: %s, want the stream relayed whole", status, answer)
	}
	if run.SettleSource.String != holds.SourceComplete || run.InTok != 1000 || run.OutTok != 400+300 || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 1000 in and 700 out (each answer's report), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
	}
}

// TestServerTaskUsageOnEachFinishingChunkIsCharged: on /v1/completions llama.cpp's server ends
// each of a call's n answers with one chunk, its choice's finishing one, carrying that answer's
// usage and its task's timings. A whole stream with n = 2 was charged its last report, one
// answer: 300 output tokens where the server made 700. Each answer is charged.
func TestServerTaskUsageOnEachFinishingChunkIsCharged(t *testing.T) {
	chunk := func(index int) string {
		return fmt.Sprintf("data: {\"choices\":[{\"text\":\"%s\",\"index\":%d,\"logprobs\":null,\"finish_reason\":null}],\"id\":\"c\",\"model\":\"fake-gpt\",\"object\":\"text_completion\"}\n\n",
			strings.Repeat("w", 40), index)
	}
	final := func(index int, completion int64) string {
		return fmt.Sprintf("data: {\"choices\":[{\"text\":\"\",\"index\":%d,\"logprobs\":null,\"finish_reason\":\"stop\"}],\"id\":\"c\",\"model\":\"fake-gpt\",\"object\":\"text_completion\","+
			"\"usage\":{\"completion_tokens\":%d,\"prompt_tokens\":1000,\"total_tokens\":%d},\"timings\":{\"prompt_n\":1000,\"predicted_n\":%d}}\n\n",
			index, completion, 1000+completion, completion)
	}
	stream := chunk(0) + chunk(1) + final(1, 300) + chunk(0) + final(0, 400) + "data: [DONE]\n\n"
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	}, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","stream":true,"n":2,"prompt":"two answers, please"}`
	status, answer, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
	if status != 200 || !strings.Contains(string(answer), "[DONE]") {
		t.Fatalf("status %d: %s, want the stream relayed whole", status, answer)
	}
	if run.SettleSource.String != holds.SourceComplete || run.InTok != 1000 || run.OutTok != 400+300 || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 1000 in and 700 out (each answer's report), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
	}
}

// TestServerTaskBodyOfSeveralChoicesIsChargedEveryChoice: llama.cpp's server answers a call with
// n > 1 whole by putting every task's choice into the first task's body, whose usage and
// timings stay that first task's alone. A call with n = 2 was charged one answer: 10 output
// tokens where the server made about 110. The second answer's text is charged at its estimate.
func TestServerTaskBodyOfSeveralChoicesIsChargedEveryChoice(t *testing.T) {
	second := strings.Repeat("w", 400)
	answer := `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"one"}},` +
		`{"finish_reason":"stop","index":1,"message":{"role":"assistant","content":"` + second + `"}}],"created":1,"model":"fake-gpt",` +
		`"object":"chat.completion","usage":{"completion_tokens":10,"prompt_tokens":1000,"total_tokens":1010},"id":"c","timings":{"prompt_n":1000,"predicted_n":10}}`
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	}, nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","n":2,"messages":[{"role":"user","content":"two answers, please"}]}`
	status, out, run := h.postRun(u.ID, key, "/v1/chat/completions", body, nil)
	if status != 200 || string(out) != answer {
		t.Fatalf("status %d: %s, want the answer relayed as sent", status, out)
	}
	if want := 10 + metering.EstimateOutputTokens(int64(len(second))); run.SettleSource.String != holds.SourceComplete || run.InTok != 1000 || run.OutTok != want || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 1000 in and %d out (the first answer's report, the second's estimate), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, want)
	}
}
