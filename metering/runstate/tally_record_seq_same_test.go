package runstate_test

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordCallWriteOfTheKeptSeqChangesNothing: a write whose seq is the one the tally already
// holds (not above it) changes nothing — the seq names one write, and only a later one may set
// the call's figures over it. Set over, a write numbered as the kept one (the same write
// resent by the client) could put other figures in place of those it holds.
func TestRecordCallWriteOfTheKeptSeqChangesNothing(t *testing.T) {
	e := newRunBudget(t)
	ctx := context.Background()
	const run = "r_seq_same"
	kept := pricing.Usage{Input: 10, Output: 50}
	if err := e.tally.RecordCallWith(ctx, run, 2, kept, 525, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.tally.RecordCallWith(ctx, run, 2, pricing.Usage{Input: 10, Output: 5}, 75, true, []byte(`{"m":1}`), nil); err != nil {
		t.Fatal(err)
	}
	want := runstate.Tallied{Usage: kept, CostMicro: 525, Calls: 1}
	if got, found, err := e.tally.Get(ctx, run); err != nil || !found || got != want {
		t.Errorf("tally %+v found=%v err=%v, want the first write of seq 2 alone %+v", got, found, err, want)
	}
}

// TestRecordCallRefusesAWriteNumberedBelowOne: a call's writes are numbered from 1; one
// numbered 0 or less is a caller that never counted its writes, whose order the tally then
// cannot keep, and is refused outright (a panic: a bug, not a state to write).
func TestRecordCallRefusesAWriteNumberedBelowOne(t *testing.T) {
	e := newRunBudget(t)
	for _, seq := range []int64{0, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("RecordCallWith numbered %d did not panic", seq)
				}
			}()
			_ = e.tally.RecordCallWith(context.Background(), "r_seq_zero", seq, pricing.Usage{Input: 1}, 1, false, nil, nil)
		}()
	}
}
