package holds_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestExpiredHoldsNoLongerCountAtAdmission: DESIGN §2 — held is Σ held_micro of the user's
// queued/running holds whose expires_at is still in the future (database time), and §3 counts
// in-flight the same way: a hold left by a dead process stops blocking its user when it expires,
// before the reconciler settles it.
func TestExpiredHoldsNoLongerCountAtAdmission(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("expired-holds", 3, nil)
	var ids []string
	for _, id := range []string{"r_exp_a", "r_exp_b", "r_exp_c"} {
		ids = append(ids, e.admit(u, id, holds.StateRunning).RunID)
	}
	_, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_exp_d", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour})
	var busy *holds.TooManyInFlightError
	if !errors.As(err, &busy) {
		t.Fatalf("fourth admission with three live holds: %v, want too many in flight", err)
	}
	e.expire(ids[0])
	b, err := e.store.Balance(e.ctx(), u.ID)
	if err != nil || b.InFlight != 2 || b.HeldMicro != 2*testHoldNormal || b.AvailableMicro != testAllowance-2*testHoldNormal {
		t.Fatalf("balance with one hold expired: %+v, %v; want 2 in flight holding %d", b, err, 2*testHoldNormal)
	}
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_exp_d", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour}); err != nil {
		t.Fatalf("admission once a hold expired: %v", err)
	}
	for _, id := range append(ids, "r_exp_d") {
		if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: id, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
}
