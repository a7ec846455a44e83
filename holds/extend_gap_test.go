package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestRunAdmittedAgainNeverShortensItsExpiry: a later call of a named run pushes the run's
// expiry out, never in. A call admitted with a shorter TTL than the run has left (a replica
// configured with a shorter run_ttl, or an expiry the reconciler pushed out) must not pull the
// expiry in, or the reconciler settles the run from its tally under the calls still running.
func TestRunAdmittedAgainNeverShortensItsExpiry(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("agent", 3, nil)
	named := holds.AdmitRequest{RunID: "x_long_agent", UserID: u.ID, ClientRunID: "long-agent", State: holds.StateRunning, TTL: time.Hour}
	h, err := e.store.Admit(e.ctx(), named)
	if err != nil {
		t.Fatal(err)
	}
	before := e.run(u, h.RunID).ExpiresAt
	named.TTL = time.Minute
	if again, err := e.store.Admit(e.ctx(), named); err != nil || !again.Existing {
		t.Fatalf("admission of the run's next call: %+v, %v", again, err)
	}
	if after := e.run(u, h.RunID).ExpiresAt; after.Before(before) {
		t.Errorf("a call admitted with a TTL of a minute moved the run's expiry in from %v to %v", before, after)
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}
