package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestSessionResendWithoutAUserMessageIsAlreadyRunning: a session's message that carries no
// user message (a Responses turn of tool outputs, a system-only prompt) is told apart by its
// whole body. The body must be the caller's, not the gateway's rewrite of it: the output bound
// the rewrite sets follows the cap, and the cap the caller's available credits, which the
// running message's hold has lowered. Hashed after the rewrite, the resend of the running
// message read as a new one and stopped it.
func TestSessionResendWithoutAUserMessageIsAlreadyRunning(t *testing.T) {
	h, gate := gatedHarness(t, func(c *config.Config) {
		tight := c.Plans["standard"]
		tight.AllowanceCredits = config.CreditsOf(30)
		c.Plans["tight"] = tight
	})
	_, key := h.user("tight")
	body := `{"model":"fake-gpt","stream":true,"max_tokens":100000,"messages":[{"role":"system","content":"Continue the story."}]}`
	session := map[string]string{"X-Session-Id": "tools-1"}

	// The first stays mid-stream until the resend is answered (gateUpstream's held stream): a
	// stream of a fixed second could end before a slow machine's resend was checked, which then
	// ran as a message sent again after its answer.
	hold, letGo := heldMidStream(t, gate, "first", slowStream(40, session))
	first := h.post(key, "/v1/chat/completions", body, hold)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(first.Body)
		t.Fatalf("first: %d %s", first.StatusCode, b)
	}
	rd := firstEvent(t, first)
	if a := send(h.gw.URL, key, body, session); a.status != http.StatusConflict || errorCode(t, a.body) != "already_running" {
		t.Fatalf("resend of the running message: %d %s, want 409 already_running", a.status, a.body)
	}
	letGo()
	runsToItsEnd(t, rd)
}
