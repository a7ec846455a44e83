package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionMessageRefusedForItsCostLeavesTheRunningOne: a session's new message replaces the
// running one only if it runs itself. One refused 402 because its prompt alone costs more than
// a call may spend stopped the running answer all the same — its caller lost both. The cost
// check now comes before the session claim: the refused message leaves the session and its
// running answer as they were.
func TestSessionMessageRefusedForItsCostLeavesTheRunningOne(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		small := c.Plans["standard"]
		small.MaxRunCostCredits, small.HoldNormalCredits, small.HoldHeavyCredits = config.CreditsOf(1), config.CreditsOf(1), config.CreditsOf(1)
		c.Plans["small"] = small
	})
	u, key := h.user("small")
	session := map[string]string{"X-Session-Id": "chat-cost"}

	old := h.post(key, "/v1/chat/completions", streamBody,
		map[string]string{"X-Session-Id": "chat-cost", fakellm.HeaderChunks: "40", fakellm.HeaderChunkInterval: "25ms"})
	defer old.Body.Close()
	if old.StatusCode != http.StatusOK {
		t.Fatalf("running message: %d", old.StatusCode)
	}
	oldRun := old.Header.Get(proxy.RunIDHeader)
	rd := afterContent(t, old, 3)

	long := `{"model":"fake-gpt","messages":[{"role":"user","content":"` + strings.Repeat("summarise this ", 400) + `"}]}`
	calls := h.fake.Calls()
	if a := send(h.gw.URL, key, long, session); a.status != http.StatusPaymentRequired || errorCode(t, a.body) != "insufficient_credits" {
		t.Fatalf("new message over the cap: %d %s, want 402 insufficient_credits", a.status, a.body)
	}
	if h.fake.Calls() != calls {
		t.Fatal("the refused message reached the upstream")
	}

	runsToItsEnd(t, rd)
	h.settled()
	if r := h.run(u.ID, oldRun); r.SettleSource.String != holds.SourceComplete {
		t.Errorf("running message settled by %q, want complete", r.SettleSource.String)
	}
	// The session still names the running message's run: the same message again is a duplicate
	// only while it runs, and it has ended, so it runs.
	if a := send(h.gw.URL, key, streamBody, session); a.status != http.StatusOK {
		t.Errorf("the session's next message: %d %s", a.status, a.body)
	}
}
