package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestBatchCountsARunsCallsOnceAsItsSettlementAndAdmissionRead: a batch that settles a named
// run and admits the same user's next call counts the run at owedMicro twice — in its
// aggregate of live holds, and when it takes the settled run out of that aggregate — from two
// statements at READ COMMITTED, while the run's calls record their cost (RecordRunCall)
// without the user's lock. The two reads must see the same record: the settled run's row is
// locked before the aggregate reads it, so a record still committing is waited for and seen
// by both, and a record that comes later waits for the batch. Were the aggregate to read the
// row before the batch held its lock, it could count the run at its hold and take it out at
// what its calls used, and the admission be given credits the run had spent.
func TestBatchCountsARunsCallsOnceAsItsSettlementAndAdmissionRead(t *testing.T) {
	setup := func(t *testing.T) (*acctFixture, holds.User) {
		f := newAcctFixture(t)
		u := f.user("racer", "standard")
		allowance, inFlight := int64(100_000), 5
		if err := f.store.SetUserLimits(f.ctx(), u.ID, &allowance, &inFlight, nil); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"x_a", "x_b"} {
			h, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, ClientRunID: id, Model: "fake-gpt",
				State: holds.StateRunning, TTL: time.Hour})
			if err != nil || h.HeldMicro != 20_000 {
				t.Fatalf("admit %s: %+v, %v", id, h, err)
			}
		}
		return f, u
	}
	type outcome struct {
		settled  []holds.BatchResult
		admitted []holds.AdmitResult
		err      error
	}
	batch := func(f *acctFixture, u holds.User, sts ...holds.Settlement) <-chan outcome {
		done := make(chan outcome, 1)
		go func() {
			s, a, err := f.store.WriteBatch(context.Background(), sts, []holds.AdmitRequest{{RunID: "r_next", UserID: u.ID,
				Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true}})
			done <- outcome{s, a, err}
		}()
		return done
	}
	observer := func(f *acctFixture) func(n int) {
		obs, err := f.db.Connx(f.ctx())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = obs.Close() })
		return func(n int) { waitLockWaits(t, obs, n) }
	}

	t.Run("record committing as the batch locks the run", func(t *testing.T) {
		f, u := setup(t)
		// x_a's call's record, still committing: 60,000 used, past its 20,000 hold.
		rec := testenv.ConsoleTx(t, f.db)
		if _, err := rec.ExecContext(f.ctx(), `UPDATE run_holds SET cost_micro = cost_micro + 60000, calls = calls + 1,
			ended_calls = ended_calls + 1 WHERE run_id = 'x_a'`); err != nil {
			t.Fatal(err)
		}
		done := batch(f, u, holds.Settlement{RunID: "x_a", UserID: u.ID, CostMicro: 60_000, Calls: 1, Source: holds.SourceClient})
		observer(f)(1)
		if err := rec.Commit(); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil || o.settled[0].Err != nil || o.admitted[0].Err != nil {
			t.Fatalf("batch: %+v, %v", o, o.err)
		}
		// 100,000 − 60,000 charged − x_b's 20,000 held: 20,000 left.
		if s, h := o.settled[0], o.admitted[0].Hold; s.ChargedMicro != 60_000 || h.HeldMicro != 20_000 || h.CapMicro != 20_000 {
			t.Fatalf("x_a charged %d, next call held %d with cap %d: want 60,000, and 20,000 and 20,000", s.ChargedMicro, h.HeldMicro, h.CapMicro)
		}
		f.settle("x_b", 0)
		f.settle("r_next", 0)
	})

	t.Run("record arriving between the batch's reads", func(t *testing.T) {
		f, u := setup(t)
		if ok, err := f.store.RecordRunCall(f.ctx(), "x_a", token.New(), time.Hour, pricing.Usage{Input: 10}, 30_000, 1, false); err != nil || !ok {
			t.Fatalf("record: %v, %v", ok, err)
		}
		// x_b's row held elsewhere: the batch locks x_a, then waits for x_b, before its aggregate.
		blocker := testenv.ConsoleTx(t, f.db)
		if _, err := blocker.ExecContext(f.ctx(), "SELECT run_id FROM run_holds WHERE run_id = 'x_b' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		done := batch(f, u, holds.Settlement{RunID: "x_a", UserID: u.ID, CostMicro: 30_000, Calls: 1, Source: holds.SourceClient},
			holds.Settlement{RunID: "x_b", UserID: u.ID, CostMicro: 0, Source: holds.SourceClient})
		waitFor := observer(f)
		waitFor(1)
		recorded := make(chan bool, 1)
		go func() {
			ok, err := f.store.RecordRunCall(context.Background(), "x_a", token.New(), time.Hour, pricing.Usage{Input: 10}, 50_000, 1, false)
			if err != nil {
				t.Error(err)
			}
			recorded <- ok
		}()
		waitFor(2) // the record waits for the batch's lock on x_a
		if err := blocker.Rollback(); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil || o.settled[0].Err != nil || o.settled[1].Err != nil || o.admitted[0].Err != nil {
			t.Fatalf("batch: %+v, %v", o, o.err)
		}
		if ok := <-recorded; ok {
			t.Error("a record that waited for the run's settlement landed on the settled run")
		}
		// 100,000 − 30,000 charged: 70,000 left, the hold at its 20,000 tier.
		if h := o.admitted[0].Hold; o.settled[0].ChargedMicro != 30_000 || h.HeldMicro != 20_000 || h.CapMicro != 70_000 {
			t.Fatalf("x_a charged %d, next call held %d with cap %d: want 30,000, and 20,000 and 70,000", o.settled[0].ChargedMicro, h.HeldMicro, h.CapMicro)
		}
		f.settle("r_next", 0)
	})
}
