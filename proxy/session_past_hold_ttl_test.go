package proxy_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionRunPastItsHoldTTLIsStoppedByANewerMessage: a session's call that outlives its
// hold's TTL (hold_ttl shorter than the call) still runs, its hold past its expiry until the
// reconciler, finding its lease, extends it. A newer message of the session claimed in that
// time read the hold as ended (the duplicate test's "live": open and unexpired), replaced
// nothing, and told nobody to stop: the old run went on to its end beside the new one and was
// charged in full. A hold still open is now replaced, and its run stopped, whatever its expiry.
func TestSessionRunPastItsHoldTTLIsStoppedByANewerMessage(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Holds.HoldTTL, c.Holds.HeartbeatInterval = 2*time.Second, time.Second
	})
	u, key := h.user("standard")
	aRun, br := runningSessionStream(t, h, key, "s") // 15 s, far past the hold's 2 s
	waitFor(t, "A's hold to expire while A runs", func() bool {
		var expired bool
		return h.db.Get(&expired, "SELECT state = 'running' AND expires_at <= NOW(6) FROM run_holds WHERE run_id = ?", aRun) == nil && expired
	})
	sendOK(t, "C", h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: another question"}]}`,
		map[string]string{proxy.SessionHeader: "s"})
	endsSuperseded(t, h, u, aRun, br, "past its hold's TTL, replaced by C")
}
