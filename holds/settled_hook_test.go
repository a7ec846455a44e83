package holds_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// settledLog records what a store's SettledHook is told.
type settledLog struct {
	mu   sync.Mutex
	seen map[string][]holds.Settled
}

func watchSettled(st *holds.Store) *settledLog {
	l := &settledLog{seen: map[string][]holds.Settled{}}
	st.OnSettled(func(s holds.Settlement, res holds.Settled) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.seen[s.RunID] = append(l.seen[s.RunID], res)
	})
	return l
}

func (l *settledLog) of(run string) []holds.Settled {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[run]
}

// TestSettledHookCountsEachChargeOnce: what a process's metrics count as charged is told once
// per settlement that charged, with what it charged — not for a second settlement of a
// settled run, nor for an unknown run, and once for a settlement whose COMMIT reply was lost
// (its retry finds its own settlement: counted, not twice and not never).
func TestSettledHookCountsEachChargeOnce(t *testing.T) {
	f, lossy := newLossyFixture(t)
	log := watchSettled(f.store)
	ctx := context.Background()

	f.admit("r_hook_a")
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_hook_a", CostMicro: 4_000, Source: holds.SourceComplete,
		Usage: pricing.Usage{Input: 10, Output: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_hook_a", CostMicro: 4_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if got := log.of("r_hook_a"); len(got) != 1 || got[0].ChargedMicro != 4_000 {
		t.Errorf("settled, then settled again: told %+v, want one charge of 4,000", got)
	}

	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_hook_none_" + testenv.RandomID(3), CostMicro: 1}); err == nil {
		t.Error("a settlement of an unknown run was accepted")
	}

	f.admit("r_hook_lost")
	lossy.Arm(commitScript, testenv.LoseReply)
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_hook_lost", CostMicro: 7_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("the settlement's commit reply was never lost")
	}
	if got := log.of("r_hook_lost"); len(got) != 1 || got[0].ChargedMicro != 7_000 {
		t.Errorf("settlement whose commit reply was lost: told %+v, want one charge of 7,000", got)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.seen) != 2 {
		t.Errorf("told of runs %v, want r_hook_a and r_hook_lost", log.seen)
	}
}

// TestWriterTellsTheSettledHookOfItsCharges: settlements committed by the batch writer (how
// the gateway settles its calls) are told to the SettledHook too, once each with what they
// charged; a second settlement of a settled run is not.
func TestWriterTellsTheSettledHookOfItsCharges(t *testing.T) {
	f := newSettleFixture(t)
	log := watchSettled(f.store)
	ctx := context.Background()
	f.admit("r_hook_writer")
	w := holds.NewWriter(f.store, holds.WriterConfig{AdmitTimeout: 10 * time.Second, SettleTimeout: 10 * time.Second})
	defer w.Close()
	for range 2 {
		if _, err := w.Settle(ctx, holds.Settlement{RunID: "r_hook_writer", UserID: f.user.ID, CostMicro: 3_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	if got := log.of("r_hook_writer"); len(got) != 1 || got[0].ChargedMicro != 3_000 {
		t.Errorf("settled through the writer, then again: told %+v, want one charge of 3,000", got)
	}
}
