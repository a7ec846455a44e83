package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileRowWithImpossibleFiguresDoesNotPanic: a named run's row records its ended
// calls (RecordRunCall), and with no tally in Redis (a restart lost it) the reconciler settles
// the run from the row. No code path writes a negative figure there, but a hand edit or a
// restored backup can, and the row was trusted as it stood: a negative cost went to the store,
// whose writer panics on one — in the reconciler's goroutine, the whole gateway, and every
// process that took the lock after it, on every pass, since the row never changes. The row's
// figures get the same check as the tally's (TallyBelievable): a run whose record cannot be
// believed is settled as one without any, at its hold, and the hold behind it still settles.
func TestReconcileRowWithImpossibleFiguresDoesNotPanic(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string // the hand edit
	}{
		{"negative cost", "calls = 1, ended_calls = 1, cost_micro = -500"},
		{"negative cost, tokens recorded", "calls = 2, ended_calls = 2, in_tok = 100, out_tok = 10, cost_micro = -1"},
		{"negative calls", "calls = -1, ended_calls = 1, cost_micro = 700"},
		{"negative tokens", "calls = 1, ended_calls = 1, out_tok = -40, cost_micro = 700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStoreEnv(t)
			u := e.user("negrow", 3, nil)
			h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_neg_row", UserID: u.ID, ClientRunID: "agent",
				Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			other := e.admit(u, "r_behind", holds.StateRunning)
			e.addTally(other.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
			if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET "+tc.set+
				", expires_at = NOW(6) - INTERVAL 2 SECOND WHERE run_id = ?", h.RunID); err != nil {
				t.Fatal(err)
			}
			e.expire(other.RunID)
			var st holds.Stats
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("reconcile pass over a row with impossible figures panicked: %v", p)
					}
				}()
				st, err = e.pass(e.reconciler("me", nil))
			}()
			if err != nil || st.ChargedHeld != 1 || st.FromTally != 1 || st.ChargedMicro != h.HeldMicro+1_000 {
				t.Fatalf("pass: %+v, %v; want the run charged its hold %d and the other its tally", st, err, h.HeldMicro)
			}
			if r := e.run(u, h.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold ||
				r.ChargedMicro != h.HeldMicro || r.CostMicro < 0 || r.Calls < 0 || r.Usage().HasNegative() {
				t.Fatalf("run %+v: want reconcile_hold at held %d", r, h.HeldMicro)
			}
		})
	}
}

// TestReconcileHoldWithAZeroExpirySettles: a hold whose expiry is the zero date (written by
// hand in a session without strict mode, or by a restore that ran without it) is the oldest
// expired hold. The settlement writes the locked row's values back in the INSERT whose update
// branch marks it settled, and the strict session refuses a zero date there: its settlement
// failed at every pass, for good, and so did every pass. It settles as any other hold.
func TestReconcileHoldWithAZeroExpirySettles(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("zero", 3, nil)
	h := e.admit(u, "r_zero_expiry", holds.StateRunning)
	e.addTally(h.RunID, pricing.Usage{Input: 10, Output: 1}, 700)
	conn, err := e.db.Conn(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(e.ctx(), "SET SESSION sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = '0000-00-00 00:00:00' WHERE run_id = ?", h.RunID); err != nil {
		t.Fatal(err)
	}
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil || st.FromTally != 1 || st.ChargedMicro != 700 {
		t.Fatalf("pass: %+v, %v; want the hold settled from its tally", st, err)
	}
	if r := e.run(u, h.RunID); r.State != holds.StateSettled || r.ChargedMicro != 700 {
		t.Fatalf("run %+v: want settled at 700", r)
	}
}
