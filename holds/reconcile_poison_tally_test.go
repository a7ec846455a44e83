package holds_test

import (
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileTallyWithNegativeFiguresDoesNotPanic: a tally with a negative figure — left by a
// gateway of before the one-call tally was set whole (its correction, added after the answer's
// end, could be negative, and stood alone once Redis lost the first write), or written by hand —
// is no record of what the run used. The reconciler must not hand it to the store, whose writer
// panics on a negative cost: in the reconciler's goroutine that took the whole gateway down, and
// every process that took the lock after it, on every pass, for as long as the tally lives.
// Its cost alone may be negative too (its tokens all zero): no record of what the run used
// either. So is a negative part of a total (one-hour cache writes, audio in or out) beside a
// cost that is not: the check left those out, and such a run was settled from its tally with
// the negative count recorded on its row.
func TestReconcileTallyWithNegativeFiguresDoesNotPanic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		usage pricing.Usage
		cost  int64
	}{
		{"negative tokens and cost", pricing.Usage{Output: -40}, -1_200},
		{"negative cost alone", pricing.Usage{}, -1_200},
		{"negative input", pricing.Usage{Input: -1}, 300},
		{"negative cache reads", pricing.Usage{CacheRead: -1}, 300},
		{"negative cache writes", pricing.Usage{CacheWrite: -1}, 300},
		{"negative output", pricing.Usage{Output: -1}, 300},
		{"negative one-hour cache writes", pricing.Usage{CacheWrite: 50, CacheWrite1h: -5}, 300},
		{"negative audio input", pricing.Usage{Input: 50, AudioInput: -5}, 300},
		{"negative audio output", pricing.Usage{Output: 50, AudioOutput: -5}, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStoreEnv(t)
			u := e.user("negtally", 3, nil)
			h := e.admit(u, "r_neg_tally", holds.StateRunning)
			if err := e.tally.Add(e.ctx(), h.RunID, tc.usage, tc.cost, false); err != nil {
				t.Fatal(err)
			}
			e.expire(h.RunID)
			var st holds.Stats
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("reconcile pass over a tally with a negative cost panicked: %v", p)
					}
				}()
				st, err = e.pass(e.reconciler("me", nil))
			}()
			// Its usage is lost: charged what it held (DESIGN §5, rule 3).
			if err != nil || st.ChargedHeld != 1 || st.ChargedMicro != h.HeldMicro {
				t.Fatalf("pass: %+v, %v; want the run charged its hold %d", st, err, h.HeldMicro)
			}
			if r := e.run(u, h.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold ||
				r.ChargedMicro != h.HeldMicro || r.Usage().HasNegative() {
				t.Fatalf("run %+v: want reconcile_hold at held %d", r, h.HeldMicro)
			}
		})
	}
}
