package holds_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestSessionIDsAreExact: X-Session-Id "Chat-A" and "chat-a" are two sessions of one user; a
// message in one must not supersede (cancel) the running call of the other.
func TestSessionIDsAreExact(t *testing.T) {
	e := newStoreEnv(t)
	u, err := e.store.CreateUser(e.ctx(), "sess-case", "standard")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"r_case_a", "r_case_b"} {
		if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: r, UserID: u.ID, Model: "m", State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.store.ClaimSession(e.ctx(), u.ID, "Chat-A", "r_case_a", sha256.Sum256([]byte("one"))); err != nil {
		t.Fatal(err)
	}
	c, err := e.store.ClaimSession(e.ctx(), u.ID, "chat-a", "r_case_b", sha256.Sum256([]byte("two")))
	if err != nil {
		t.Fatal(err)
	}
	if c.Replaced != "" || c.Duplicate {
		t.Fatalf("claim of session %q: %+v; it took over session %q's running call", "chat-a", c, "Chat-A")
	}
	for _, r := range []string{"r_case_a", "r_case_b"} {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: r, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}
