package holds_test

import (
	"crypto/sha256"
	"fmt"
	"maps"
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

// TestCurrentSessionRunsReadsEverySessionAsked: the session check's read names each session it
// is asked, past one statement's bound (200), exactly (case and all), and leaves out those
// without a row.
func TestCurrentSessionRunsReadsEverySessionAsked(t *testing.T) {
	e := newStoreEnv(t)
	u, err := e.store.CreateUser(e.ctx(), "sess-current", "standard")
	if err != nil {
		t.Fatal(err)
	}
	var refs []holds.SessionRef
	want := map[holds.SessionRef]string{}
	for i := range 203 {
		ref := holds.SessionRef{UserID: u.ID, SessionID: fmt.Sprintf("Chat-%d", i)}
		run := fmt.Sprintf("r_current_%d", i)
		if _, err := e.store.ClaimSession(e.ctx(), u.ID, ref.SessionID, run, sha256.Sum256([]byte(run))); err != nil {
			t.Fatal(err)
		}
		refs, want[ref] = append(refs, ref), run
	}
	refs = append(refs, holds.SessionRef{UserID: u.ID, SessionID: "chat-1"}, holds.SessionRef{UserID: u.ID + 1, SessionID: "Chat-1"})
	got, err := e.store.CurrentSessionRuns(e.ctx(), refs)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("current runs of %d sessions: got %d, want %d (first: %v)", len(refs), len(got), len(want), got[refs[0]])
	}
}
