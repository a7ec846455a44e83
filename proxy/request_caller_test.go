package proxy_test

import (
	"testing"
)

// TestNullStreamIsNotAStream: OpenAI's API takes "stream": null as its default, false, as the
// gateway takes a null max_tokens or n; clients that write every optional field (null when
// unset) must not be refused with 400 invalid_stream.
func TestNullStreamIsNotAStream(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	r, _ := h.answeredRun(u.ID, key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":null,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if r.ChargedMicro <= 0 {
		t.Fatalf("answered call charged %d", r.ChargedMicro)
	}
}
