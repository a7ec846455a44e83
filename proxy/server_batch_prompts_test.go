package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// TestServerTaskBatchIsChargedEveryPrompt: llama.cpp's server runs each prompt of a
// /v1/completions batch as a task of its own, and each task's report counts its own prompt
// alone. Whole, every task's choice goes into the first task's body beside that task's usage
// and timings; streamed, each task ends with its own. A batch of two prompts was charged the
// prompt of one: 90 input tokens where the server read about 290 (whole), 300 (streamed).
// Every prompt is charged: by its task's report, or at its estimate where no report counted it.
func TestServerTaskBatchIsChargedEveryPrompt(t *testing.T) {
	first, second := strings.Repeat("x", 400), strings.Repeat("y", 800)
	request := func(stream bool) string {
		return fmt.Sprintf(`{"model":"fake-gpt","stream":%v,"max_tokens":16,"prompt":["%s","%s"]}`, stream, first, second)
	}
	final := func(index int, text string, prompt int64) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":%d,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt","system_fingerprint":"b1","object":"text_completion",`+
			`"usage":{"completion_tokens":16,"prompt_tokens":%d,"total_tokens":%d},"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":%d,"predicted_n":16}}`,
			text, index, prompt, prompt+16, prompt)
	}
	text := strings.Repeat("w", 64)
	whole := strings.Replace(final(0, text, 90), `}],"created"`, `},{"text":"`+text+`","index":1,"logprobs":null,"finish_reason":"length"}],"created"`, 1)
	stream := fmt.Sprintf("data: {\"choices\":[{\"text\":%q,\"index\":0,\"logprobs\":null,\"finish_reason\":null}],\"model\":\"fake-gpt\",\"object\":\"text_completion\",\"id\":\"cmpl-l\"}\n\n", text) +
		fmt.Sprintf("data: {\"choices\":[{\"text\":%q,\"index\":1,\"logprobs\":null,\"finish_reason\":null}],\"model\":\"fake-gpt\",\"object\":\"text_completion\",\"id\":\"cmpl-l\"}\n\n", text) +
		"data: " + final(1, "", 210) + "\n\n" + "data: " + final(0, "", 90) + "\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name        string
		stream      bool
		answer      string
		input, outp int64
	}{
		// Whole: the second prompt at its estimate, 800 bytes at 4 a token.
		{"whole", false, whole, 90 + 200, 16 + metering.EstimateOutputTokens(int64(len(text)))},
		{"streamed", true, stream, 90 + 210, 16 + 16},
	} {
		h := fixedAnswerHarness(t, tc.stream, tc.answer)
		u, key := h.user("standard")
		status, _, run := h.postRun(u.ID, key, "/v1/completions", request(tc.stream), nil)
		if status != 200 {
			t.Fatalf("%s: status %d", tc.name, status)
		}
		if run.SettleSource.String != holds.SourceComplete || run.InTok != tc.input || run.OutTok != tc.outp || !run.Estimated {
			t.Errorf("%s: run settled by %q in=%d out=%d estimated=%v, want complete charged %d in (every prompt) and %d out, estimated",
				tc.name, run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, tc.input, tc.outp)
		}
	}
}

// TestServerTaskMixedPromptIsOnePrompt: llama.cpp's server reads a prompt that is an array of
// both strings and token ids ([12, 34, "string", 56]) as one prompt, the strings tokenized in
// place between the tokens (tokenize_input_prompts: "string or mixed"), and runs it as one
// task whose report counts all of it. The gateway read it as a batch of one prompt an
// element: the task's report was taken for the first element's, and the other elements were
// charged again at their estimates on top, 202 input tokens (505 µUSD at fake-gpt's prices) the
// server never read twice. It is one prompt, charged its report.
func TestServerTaskMixedPromptIsOnePrompt(t *testing.T) {
	request := func(stream bool) string {
		return fmt.Sprintf(`{"model":"fake-gpt","stream":%v,"max_tokens":16,"prompt":["%s",13,27,"%s"]}`, stream, strings.Repeat("x", 400), strings.Repeat("y", 800))
	}
	final := func(text string) string {
		return fmt.Sprintf(`{"choices":[{"text":%q,"index":0,"logprobs":null,"finish_reason":"length"}],"created":1,"model":"fake-gpt","system_fingerprint":"b1","object":"text_completion",`+
			`"usage":{"completion_tokens":16,"prompt_tokens":302,"total_tokens":318},"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":302,"predicted_n":16}}`, text)
	}
	text := strings.Repeat("w", 64)
	stream := fmt.Sprintf("data: {\"choices\":[{\"text\":%q,\"index\":0,\"logprobs\":null,\"finish_reason\":null}],\"model\":\"fake-gpt\",\"object\":\"text_completion\",\"id\":\"cmpl-l\"}\n\n", text) +
		"data: " + final("") + "\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name   string
		stream bool
		answer string
	}{{"whole", false, final(text)}, {"streamed", true, stream}} {
		h := fixedAnswerHarness(t, tc.stream, tc.answer)
		u, key := h.user("standard")
		status, _, run := h.postRun(u.ID, key, "/v1/completions", request(tc.stream), nil)
		if status != 200 {
			t.Fatalf("%s: status %d", tc.name, status)
		}
		if run.SettleSource.String != holds.SourceComplete || run.InTok != 302 || run.OutTok != 16 || run.Estimated {
			t.Errorf("%s: run settled by %q in=%d out=%d estimated=%v, want complete charged its report, 302 in and 16 out, not estimated",
				tc.name, run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
		}
	}
}

// TestServerTaskBatchOfAMultimodalPromptIsCharged: llama.cpp's server takes a prompt of a batch
// as an object of its text and its media ({"prompt_string": ..., "multimodal_data": [...]}).
// Its whole answer to a batch reports its first task alone, and the other prompts are charged at
// their estimates: such a prompt's was 0, and a batch of a text prompt and an image with its
// question was charged the text prompt alone (90 input tokens, where the server read some 1 700
// more: 4 250 µUSD at fake-gpt's prices, unbilled). It is charged its estimate, text and media.
func TestServerTaskBatchOfAMultimodalPromptIsCharged(t *testing.T) {
	text := strings.Repeat("w", 64)
	answer := fmt.Sprintf(`{"choices":[{"text":%q,"index":0,"logprobs":null,"finish_reason":"length"},{"text":%q,"index":1,"logprobs":null,"finish_reason":"length"}],`+
		`"created":1,"model":"fake-gpt","system_fingerprint":"b1","object":"text_completion","usage":{"completion_tokens":16,"prompt_tokens":90,"total_tokens":106},`+
		`"id":"cmpl-l","timings":{"cache_n":0,"prompt_n":90,"predicted_n":16}}`, text, text)
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, answer)
	}, nil)
	u, key := h.user("standard")
	image := strings.Repeat("iVBORw0K", 1000)
	body := `{"model":"fake-gpt","max_tokens":16,"prompt":["` + strings.Repeat("x", 400) + `",{"prompt_string":"` + strings.Repeat("y", 400) +
		`","multimodal_data":["` + image + `"]}]}`
	status, _, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	if want := int64(90 + 100 + 1600); run.SettleSource.String != holds.SourceComplete || run.InTok != want || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged %d in (the first task's report, the other prompt's text and image at their estimate), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, want)
	}
}
