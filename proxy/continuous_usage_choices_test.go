package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestContinuousUsageOfACutStreamWithChoicesChargesEveryChoice: a vLLM stream asked for
// continuous_usage_stats with n = 2 carries one choice a chunk, and a usage of that choice's
// tokens alone; only its final report, after every choice, sums them. Broken before that
// final report, the call was charged the last chunk's choice: 300 output tokens where the
// provider made 700, which it bills. Each choice is charged its own last report.
func TestContinuousUsageOfACutStreamWithChoicesChargesEveryChoice(t *testing.T) {
	chunk := func(index int, completion int64) string {
		return fmt.Sprintf("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"fake-gpt\","+
			"\"choices\":[{\"index\":%d,\"delta\":{\"content\":\"%s\"},\"finish_reason\":null}],"+
			"\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
			index, strings.Repeat("w", 40), completion, 1000+completion)
	}
	stream := chunk(0, 100) + chunk(1, 100) + chunk(0, 400) + chunk(1, 300)
	h := hostileHarness(t, closeDelimited(t, "text/event-stream", stream+chunk(0, 500)[:40]), nil)
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","stream":true,"n":2,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"two answers, please"}]}`
	status, answer, run := h.postRun(u.ID, key, "/v1/chat/completions", body, nil)
	if status != 200 || !strings.Contains(string(answer), `"code":"upstream_broken"`) {
		t.Fatalf("status %d: %s, want the stream relayed and its break said", status, answer)
	}
	if run.SettleSource.String != holds.SourceStreamError || run.InTok != 1000 || run.OutTok != 400+300 || !run.Estimated {
		t.Errorf("run settled by %q in=%d out=%d estimated=%v, want stream_error charged 1000 in and 700 out (each choice's last report), estimated",
			run.SettleSource.String, run.InTok, run.OutTok, run.Estimated)
	}
}
