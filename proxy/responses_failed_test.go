package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestResponsesFailedWithUsageIsCharged: a Responses stream that fails after the model worked
// (a reasoning model: no visible text, thousands of hidden reasoning tokens) reports what it
// used in response.failed's response.usage, as response.completed does. The gateway settles
// an error event "with no output and no usage" at 0; a usage the provider reported in the
// failure itself is a usage, and must be charged.
func TestResponsesFailedWithUsageIsCharged(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
		fmt.Fprint(w, "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]}}\n\n")
		fmt.Fprint(w, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"usage\":{\"input_tokens\":1000,\"output_tokens\":5000,\"output_tokens_details\":{\"reasoning_tokens\":5000},\"total_tokens\":6000}}}\n\n")
	}))
	t.Cleanup(ts.Close)
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "resp", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","input":"think hard","stream":true}`, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
	if run.OutTok != 5000 || run.ChargedMicro == 0 {
		t.Fatalf("the provider reported 1000 input and 5000 output tokens in response.failed; settled %s: in_tok=%d out_tok=%d charged %d µUSD",
			run.SettleSource.String, run.InTok, run.OutTok, run.ChargedMicro)
	}
}

// TestResponsesToolCallStreamedThenErrorIsCharged: a Responses stream whose model wrote a
// client-side tool's call — a shell command (response.shell_call_command.delta), a patch
// streamed as diff deltas, or one delivered whole in response.output_item.done — and then
// ended with the provider's error event, with no usage, produced output: it is charged the
// estimate of its prompt and of that call (stream_error), not settled at 0 as a failure that
// produced nothing.
func TestResponsesToolCallStreamedThenErrorIsCharged(t *testing.T) {
	const diff = `@@ -1,3 +1,3 @@\\n-func old() {}\\n+func renamedToSomethingLonger() { return }\\n`
	cases := map[string]string{
		"shell command":         "event: response.shell_call_command.delta\ndata: {\"type\":\"response.shell_call_command.delta\",\"output_index\":0,\"command_index\":0,\"delta\":\"find / -name '*.log' -mtime -1 | xargs grep -l ERROR | sort | uniq -c\"}\n\n",
		"patch diff deltas":     "event: response.apply_patch_call_operation_diff.delta\ndata: {\"type\":\"response.apply_patch_call_operation_diff.delta\",\"output_index\":0,\"item_id\":\"ap_1\",\"delta\":\"" + diff + "\"}\n\n",
		"patch delivered whole": "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"apply_patch_call\",\"id\":\"ap_1\",\"call_id\":\"c1\",\"status\":\"completed\",\"operation\":{\"type\":\"update_file\",\"path\":\"main.go\",\"diff\":\"" + diff + "\"}}}\n\n",
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n")
				fmt.Fprint(w, call)
				fmt.Fprint(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"server_error\",\"code\":\"server_error\",\"message\":\"boom\"}}\n\n")
			}))
			t.Cleanup(ts.Close)
			h := newHarness(t, func(c *configT) {
				c.Upstreams = []config.Upstream{{Name: "resp", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
			})
			u, key := h.user("standard")
			resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","input":"fix it","tools":[{"type":"shell"},{"type":"apply_patch"}],"stream":true}`, nil)
			readAll(t, resp.Body)
			resp.Body.Close()
			run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
			if run.SettleSource.String != "stream_error" || run.OutTok == 0 || run.ChargedMicro == 0 {
				t.Fatalf("the model streamed a tool call before the error; settled %s: in_tok=%d out_tok=%d charged %d µUSD, want stream_error with the call's output",
					run.SettleSource.String, run.InTok, run.OutTok, run.ChargedMicro)
			}
		})
	}
}
