package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// llamaOwnAnswer is a llama.cpp server task's whole answer, or its stream's last event, in the
// server's own shape, which its builds before PR 10974 (December 2024) answered /v1/completions
// with (send_final_response): content, stop, its answer's tokens_predicted and its prompt's
// tokens_evaluated, its timings; no choices, no usage.
func llamaOwnAnswer(index int, content string, prompt, predicted int64) string {
	return fmt.Sprintf(`{"content":%q,"id_slot":0,"stop":true,"model":"fake-gpt","tokens_predicted":%d,"tokens_evaluated":%d,`+
		`"generation_settings":{"n_ctx":4096,"model":"fake-gpt"},"prompt":"p","truncated":false,"stopped_eos":true,"stopped_word":false,"stopped_limit":false,`+
		`"stopping_word":"","tokens_cached":%d,"timings":{"prompt_n":%d,"predicted_n":%d},"index":%d}`,
		content, predicted, prompt, prompt+predicted, prompt, predicted, index)
}

// TestServerTaskOwnShapeIsCharged: those builds' answers, whole or streamed, were read as no
// answer: the call was charged its prompt's estimate and no output at all, where the server
// decoded 300 tokens. Each is charged its counts: tokens_evaluated in, tokens_predicted out.
func TestServerTaskOwnShapeIsCharged(t *testing.T) {
	whole := llamaOwnAnswer(0, strings.Repeat("w", 1200), 1000, 300)
	partial := func(content string) string {
		return fmt.Sprintf("data: {\"content\":%q,\"stop\":false,\"id_slot\":0,\"multimodal\":false,\"index\":0}\n\n", content)
	}
	stream := partial(strings.Repeat("w", 600)) + partial(strings.Repeat("w", 600)) + "data: " + llamaOwnAnswer(0, "", 1000, 300) + "\n\n"
	for _, tc := range []struct {
		name, body, contentType, answer string
	}{
		{"whole", `{"model":"fake-gpt","prompt":"say something long"}`, "application/json", whole},
		{"streamed", `{"model":"fake-gpt","stream":true,"prompt":"say something long"}`, "text/event-stream", stream},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				fmt.Fprint(w, tc.answer)
			}, nil)
			u, key := h.user("standard")
			status, out, run := h.postRun(u.ID, key, "/v1/completions", tc.body, nil)
			if status != 200 || string(out) != tc.answer {
				t.Fatalf("status %d: %s, want the answer relayed as sent", status, out)
			}
			if run.SettleSource.String != holds.SourceComplete || run.InTok != 1000 || run.OutTok != 300 || run.Estimated {
				t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 1000 in and 300 out (the server's counts), not estimated",
					run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
			}
		})
	}
}

// TestServerTaskOwnShapeOfABatchIsCharged: those builds answered a batch of prompts, not
// streamed, with a JSON array of such answers, one a prompt's task. It was charged its prompts'
// estimate and none of its output. Every answer's counts are charged, summed.
func TestServerTaskOwnShapeOfABatchIsCharged(t *testing.T) {
	batch := "[" + llamaOwnAnswer(0, strings.Repeat("w", 64), 90, 16) + "," + llamaOwnAnswer(1, strings.Repeat("w", 64), 210, 16) + "," +
		llamaOwnAnswer(2, strings.Repeat("w", 64), 310, 16) + "]"
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
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want complete charged 610 in and 48 out (every answer's counts, summed), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
	}
}

// TestServerTaskOwnShapeOversizedIsCharged: the same answers too large to relay (past
// max_response_bytes) were read past for a usage at their end, which they have none of, and
// their content was no text the read-past counted: charged the prompt's estimate and no output,
// where the server made 2 000 tokens an answer. Each is charged its counts, as read whole.
func TestServerTaskOwnShapeOversizedIsCharged(t *testing.T) {
	text := strings.Repeat("word ", 4000)
	for _, tc := range []struct {
		name, prompt, answer string
		in, out              int64
		estimated            bool
	}{
		{"one", `"say something long"`, llamaOwnAnswer(0, text, 1000, 2000), 1000, 2000, false},
		{"batch", `["` + strings.Repeat("x", 400) + `","` + strings.Repeat("y", 800) + `"]`,
			"[" + llamaOwnAnswer(0, text, 90, 2000) + "," + llamaOwnAnswer(1, text, 210, 2000) + "]", 90 + 210, 2 * 2000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, tc.answer)
			}, func(c *config.Config) { c.Limits.MaxResponseBytes = 16 << 10 })
			u, key := h.user("standard")
			body := `{"model":"fake-gpt","max_tokens":2000,"prompt":` + tc.prompt + `}`
			status, out, run := h.postRun(u.ID, key, "/v1/completions", body, nil)
			if status != http.StatusBadGateway || errorCode(t, out) != "upstream_response_too_large" {
				t.Fatalf("status %d: %s, want 502 upstream_response_too_large", status, out)
			}
			if run.InTok != tc.in || run.OutTok != tc.out || run.Estimated != tc.estimated || run.CostMicro != fakeGPTCost(tc.in, tc.out) {
				t.Errorf("run settled by %q in=%d out=%d estimated=%v cost %d µUSD, want %d in and %d out (the server's counts), estimated %v, %d µUSD",
					run.SettleSource.String, run.InTok, run.OutTok, run.Estimated, run.CostMicro, tc.in, tc.out, tc.estimated, fakeGPTCost(tc.in, tc.out))
			}
		})
	}
}
