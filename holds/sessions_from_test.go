package holds_test

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestClaimSessionFrom: a message that waited before its claim (ClaimSessionFrom, from the
// session's current run as its wait began) claims the session as any message does while that
// run is still current, or while the session has no row; one a newer message claimed since is
// answered Superseded, replacing nothing and writing nothing, and the same message as the one
// running is still a duplicate.
func TestClaimSessionFrom(t *testing.T) {
	e := newStoreEnv(t)
	u, err := e.store.CreateUser(e.ctx(), "sessfrom", "standard")
	if err != nil {
		t.Fatal(err)
	}
	admit := func(runID string) {
		t.Helper()
		if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, SessionID: "s1", Model: "m",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	release := func(runID, source string) {
		t.Helper()
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: runID, Source: source}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(runID, msg string, from *string) holds.SessionClaim {
		t.Helper()
		var c holds.SessionClaim
		var err error
		if from != nil {
			c, err = e.store.ClaimSessionFrom(e.ctx(), u.ID, "s1", runID, sha256.Sum256([]byte(msg)), *from)
		} else {
			c, err = e.store.ClaimSession(e.ctx(), u.ID, "s1", runID, sha256.Sum256([]byte(msg)))
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	none, r1 := "", "r1"
	admit("r1")
	if c := claim("r1", "first", &none); c.Superseded || c.Current != "r1" {
		t.Fatalf("a new session, none current when the wait began: %+v", c)
	}
	admit("r2")
	if c := claim("r2", "second", &r1); c.Superseded || c.Replaced != "r1" || c.Current != "r2" {
		t.Fatalf("r1 still current, as when the wait began: %+v", c)
	}
	admit("r3")
	if c := claim("r3", "third", &r1); !c.Superseded || c.Replaced != "" || c.Current != "r2" {
		t.Fatalf("r2 claimed the session since the wait began: %+v, want Superseded by r2, nothing replaced", c)
	}
	release("r1", holds.SourceCancel)
	release("r3", holds.SourceRelease)
	admit("r4")
	if c := claim("r4", "second", &r1); !c.Duplicate || c.Current != "r2" {
		t.Fatalf("the same message as r2's, which claimed since the wait began: %+v, want a duplicate", c)
	}
	release("r4", holds.SourceDuplicate)
	admit("r5")
	if c := claim("r5", "fifth", nil); c.Replaced != "r2" || c.Current != "r5" {
		t.Fatalf("a claim that did not wait, after the superseded one: %+v, want r2 replaced (the superseded claim wrote nothing)", c)
	}
}
