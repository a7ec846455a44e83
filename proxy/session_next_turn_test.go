package proxy_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionNextTurnRepeatingTheFirstQuestionReplacesTheRunningOne: a session's next turn
// sends the whole conversation again, its first user message included, and a new one last.
// "The same message" is the last user message: the next turn is a different message, so it
// runs and the running one is stopped, charged what it used; it is not refused 409
// already_running because its first user message is the running call's. Mutant: the hash
// taking the first user message in place of the last.
func TestSessionNextTurnRepeatingTheFirstQuestionReplacesTheRunningOne(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	aRun, br := runningSessionStream(t, h, key, "turns")
	next := `{"model":"fake-gpt","messages":[{"role":"user","content":"Stream to the billing team, please."},` +
		`{"role":"assistant","content":"On its way."},{"role":"user","content":"B: and to the auditors?"}]}`
	b := send(h.gw.URL, key, next, map[string]string{proxy.SessionHeader: "turns"})
	if b.status != http.StatusOK {
		t.Fatalf("next turn: %d %s; want it run, a different last message", b.status, b.body)
	}
	endsSuperseded(t, h, u, aRun, br, "replaced by the session's next turn")
}

// TestSessionResponsesResendIsAlreadyRunning: on /v1/responses the message is the last user
// item of input, as on chat it is the last user message: a resend of the running message with
// other fields changed (a refresh) is a duplicate, refused 409 already_running and not run. Taken
// for a new message it stopped the running call, charged what it used, and ran the same message
// again, charged again. Mutant: the Responses body hashed whole (its input list not read). An
// input sent as a plain string is the message itself, hashed alone as the list's item is: read
// as a list (of nothing), the whole body was hashed, and the refresh replaced the running call.
func TestSessionResponsesResendIsAlreadyRunning(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"input list", `{"model":"fake-gpt","stream":true,"input":[{"role":"user","content":"Stream to the billing team, please."}]}`},
		{"input string", `{"model":"fake-gpt","stream":true,"input":"Stream to the billing team, please."}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			_, key := h.user("standard")
			a := h.post(key, "/v1/responses", tc.body, map[string]string{proxy.SessionHeader: "resp",
				fakellm.HeaderChunks: strconv.Itoa(longSessionChunks), fakellm.HeaderChunkInterval: "10ms"})
			t.Cleanup(func() { a.Body.Close() })
			if _, err := bufio.NewReader(a.Body).ReadString('\n'); err != nil || a.StatusCode != http.StatusOK {
				t.Fatalf("A: %d %v", a.StatusCode, err)
			}
			resend := strings.Replace(tc.body, `"model":"fake-gpt"`, `"model":"fake-gpt","temperature":0.5`, 1)
			b := sendTo(h.gw.URL, "/v1/responses", key, resend, map[string]string{proxy.SessionHeader: "resp"})
			if b.status != http.StatusConflict || errorCode(t, b.body) != "already_running" {
				t.Fatalf("resend: %d %s; want 409 already_running", b.status, b.body)
			}
		})
	}
}

// TestSessionResendEndingPastItsUserMessageIsAlreadyRunning: "the same message" is the last
// user message, not the last message: a resend of the running message with an assistant turn
// after it (a prefill the answer is to continue) asks the same question, refused 409
// already_running and not run. Taken for a new message it stopped the running call, charged
// what it used, and ran the same question again, charged again. Mutant: the hash taking the
// last message of any role.
func TestSessionResendEndingPastItsUserMessageIsAlreadyRunning(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	runningSessionStream(t, h, key, "prefill")
	resend := `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Stream to the billing team, please."},` +
		`{"role":"assistant","content":"Streaming to"}]}`
	b := send(h.gw.URL, key, resend, map[string]string{proxy.SessionHeader: "prefill"})
	if b.status != http.StatusConflict || errorCode(t, b.body) != "already_running" {
		t.Fatalf("resend with a prefill: %d %s; want 409 already_running", b.status, b.body)
	}
}
