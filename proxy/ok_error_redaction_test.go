package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestOperatorAccountNotNamedInAnErrorUnder200: some servers answer an error with a 200, a
// whole error object or, in a stream, an error event. Those are errors all the same, worded by
// the provider with the operator's organisation and project ids as its 4xx are
// (TestOperatorAccountNotNamedInRelayedErrors): the caller gets them without the ids. A model's
// answer that says "org-…" is its text and is relayed as it came.
func TestOperatorAccountNotNamedInAnErrorUnder200(t *testing.T) {
	const org, proj = "org-AbCdEf0123456789ghIJklMN", "proj_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
	errObject := `{"error":{"message":"Rate limit reached for fake-gpt in organization ` + org + ` (project ` + proj +
		`) on tokens per min (TPM).","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`
	for _, tc := range []struct {
		name, body string
		stream     bool
	}{
		{"whole error object", errObject, false},
		{"stream error event", hostileChunk + "data: " + errObject + "\n\n", true},
	} {
		h := fixedAnswerHarness(t, tc.stream, tc.body)
		_, key := h.user("standard")
		req := chatBody
		if tc.stream {
			req = streamBody
		}
		resp := h.post(key, "/v1/chat/completions", req, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d: %s, want the upstream's 200 as it came", tc.name, resp.StatusCode, body)
		}
		if strings.Contains(string(body), org) || strings.Contains(string(body), proj) {
			t.Errorf("%s under a 200 names the operator's account: %s", tc.name, body)
		}
		if !strings.Contains(string(body), "Rate limit reached") {
			t.Errorf("%s: the provider's words are lost: %s", tc.name, body)
		}
	}

	answer := `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant",` +
		`"content":"Your id is ` + org + `."},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`
	h := fixedAnswerHarness(t, false, answer)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != answer {
		t.Errorf("a model's answer naming an org id: %d %s, want it relayed as it came", resp.StatusCode, body)
	}
}
