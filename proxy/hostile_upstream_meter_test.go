package proxy_test

import (
	"fmt"
	"net/http"
	"testing"
)

// hostileUsageBody is a whole chat answer reporting 10 prompt and 400 completion tokens.
const hostileUsageBody = `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant",` +
	`"content":"Hello billing team, here is a fairly long answer for you."},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":10,"completion_tokens":400,"total_tokens":410}}`

// A JSON answer that starts with a UTF-8 byte order mark (a .NET or Windows-hosted compatible
// server writes one; Python's json, under the OpenAI SDK, reads past it): the caller gets a
// usable answer, so the call must be charged the usage it reports, not its prompt's estimate
// with no output at all.
func TestHostileBOMBodyIsMetered(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, "\xEF\xBB\xBF"+hostileUsageBody)
	}, nil)
	u, key := h.user("standard")
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	if run.OutTok != 400 || run.InTok != 10 || run.Estimated {
		t.Fatalf("run in=%d out=%d estimated=%v source=%s, want the reported 10/400",
			run.InTok, run.OutTok, run.Estimated, run.SettleSource.String)
	}
}
