package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// An answer nested deep — a whole one, or a stream's event — is checked for whole JSON (is it
// cut? is a stream answered whole?) by gjson's recursive descent, a stack frame per level: an
// upstream's 4 MiB of brackets (within max_response_bytes and max_event_bytes) grew one
// call's stack to 512 MiB, and one of 8 MiB killed the process past Go's 1 GB stack limit,
// every call in flight with it. Nesting deeper than a request may have is no JSON here.
func TestDeeplyNestedAnswerIsCheckedWithoutDeepRecursion(t *testing.T) {
	const depth = 4 << 20
	for _, tc := range []struct {
		name, ctype, request, answer string
	}{
		{"whole", "application/json", chatBody, `{"id":"x","object":"chat.completion","model":"fake-gpt","x":`},
		{"stream answered whole", "text/event-stream", streamBody, `{"id":"x","object":"chat.completion","model":"fake-gpt","x":`},
		{"stream cut in an event", "text/event-stream", streamBody, hostileChunk + `data: {"id":"x","x":`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := tc.answer + strings.Repeat("[", depth)
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				fmt.Fprint(w, answer)
			}, nil)
			u, key := h.user("standard")
			peak := watchPeakStack()
			status, _, run := h.postRun(u.ID, key, "/v1/chat/completions", tc.request, nil)
			stacks := peak()
			t.Logf("%d-byte answer of depth %d: status %d; run src=%s est=%v; peak stack in use %d MiB", len(answer), depth,
				status, run.SettleSource.String, run.Estimated, stacks>>20)
			if stacks > maxStacksOfOneCall {
				t.Errorf("one answer took the process's stacks to %d MiB", stacks>>20)
			}
			if run.State != "settled" {
				t.Errorf("run %s, want it settled", run.State)
			}
		})
	}
}
