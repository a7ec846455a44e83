package holds_test

import (
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// ClaimSession is the conditional update of DESIGN §6: same message while the current run is
// live -> duplicate; a different message -> the live run is replaced; an ended run -> the
// session simply moves on.
func TestClaimSession(t *testing.T) {
	e := newStoreEnv(t)
	u, err := e.store.CreateUser(e.ctx(), "sess", "standard")
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
	claim := func(runID string, msg string) holds.SessionClaim {
		t.Helper()
		c, err := e.store.ClaimSession(e.ctx(), u.ID, "s1", runID, sha256.Sum256([]byte(msg)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	admit("r1")
	if c := claim("r1", "hello"); c.Duplicate || c.Replaced != "" || c.Current != "r1" {
		t.Fatalf("new session: %+v", c)
	}
	admit("r2")
	if c := claim("r2", "hello"); !c.Duplicate || c.Current != "r1" {
		t.Fatalf("same message while r1 runs: %+v", c)
	}
	release("r2", holds.SourceDuplicate)
	admit("r3")
	if c := claim("r3", "something else"); c.Duplicate || c.Replaced != "r1" || c.Current != "r3" {
		t.Fatalf("different message: %+v", c)
	}
	release("r1", holds.SourceCancel)
	release("r3", holds.SourceComplete)
	admit("r4")
	if c := claim("r4", "something else"); c.Duplicate || c.Replaced != "" || c.Current != "r4" {
		t.Fatalf("same message after the run ended: %+v", c)
	}
	release("r4", holds.SourceComplete)
	for _, id := range []string{"r1", "r4"} {
		if live, err := e.store.RunLive(e.ctx(), id); err != nil || live {
			t.Fatalf("RunLive(%s) = %v, %v", id, live, err)
		}
	}
}

// Concurrent claims of one new session with one message: exactly one wins.
func TestClaimSessionConcurrentSameMessage(t *testing.T) {
	e := newStoreEnv(t)
	u, err := e.store.CreateUser(e.ctx(), "sess2", "standard")
	if err != nil {
		t.Fatal(err)
	}
	const n = 3 // max_in_flight
	ids := []string{"c1", "c2", "c3"}
	for _, id := range ids {
		if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "m",
			State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	res := make([]holds.SessionClaim, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := e.store.ClaimSession(e.ctx(), u.ID, "new", ids[i], sha256.Sum256([]byte("same")))
			if err != nil {
				t.Error(err)
			}
			res[i] = c
		}()
	}
	wg.Wait()
	winners := 0
	for i, c := range res {
		if !c.Duplicate {
			winners++
		} else if c.Current == ids[i] {
			t.Errorf("%s is a duplicate of itself", ids[i])
		}
	}
	if winners != 1 {
		t.Fatalf("%d claims won, want 1: %+v", winners, res)
	}
	for _, id := range ids {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: id, Source: holds.SourceDuplicate}); err != nil {
			t.Fatal(err)
		}
	}
}
