package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// partsUsage is one call's usage with every part a provider's invoice lists on a line of its
// own: one-hour cache writes of the cache writes, audio of the input, audio of the output.
var partsUsage = pricing.Usage{Input: 1040, AudioInput: 1000, CacheRead: 7, CacheWrite: 418, CacheWrite1h: 400,
	Output: 300, AudioOutput: 250}

// TestUsagePartsStoredApart: one-hour cache writes and audio tokens were priced apart but
// stored only in the totals, so a billing team setting a day's tokens against a provider's
// invoice (which lists them on their own lines) could not split them. Each way a run is
// settled keeps them: by its process, by the reconciler from its Redis tally (the process
// died before its settlement), and from a named run's row, its calls recorded as they ended
// (RecordRunCall), when Redis lost the tally. The usage report sums them.
func TestUsagePartsStoredApart(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("parts", 5, nil)
	const cost = 9_000

	e.admit(u, "r_parts_settled", holds.StateRunning)
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: "r_parts_settled", UserID: u.ID, Usage: partsUsage,
		CostMicro: cost, Calls: 1, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}

	e.admit(u, "r_parts_tally", holds.StateRunning)
	e.addTally("r_parts_tally", partsUsage, cost)
	e.expire("r_parts_tally")

	e.admit(u, "r_parts_row", holds.StateRunning)
	half := pricing.Usage{Input: 520, AudioInput: 500, CacheRead: 3, CacheWrite: 209, CacheWrite1h: 200, Output: 150, AudioOutput: 125}
	for _, call := range []pricing.Usage{half, partsUsage.Sub(half)} {
		if ok, err := e.store.RecordRunCall(e.ctx(), "r_parts_row", token.New(), time.Hour, call, cost/2, 1, false); err != nil || !ok {
			t.Fatalf("record call: %v, %v", ok, err)
		}
	}
	if live := e.run(u, "r_parts_row"); live.Usage() != partsUsage {
		t.Fatalf("live named run's row records %+v, want %+v", live.Usage(), partsUsage)
	}
	e.expire("r_parts_row")

	if st, err := e.pass(e.reconciler("me", nil)); err != nil || st.FromTally != 2 {
		t.Fatalf("reconcile: %+v, %v; want the two runs settled from their records", st, err)
	}
	for _, id := range []string{"r_parts_settled", "r_parts_tally", "r_parts_row"} {
		r := e.run(u, id)
		if r.State != holds.StateSettled || r.Usage() != partsUsage {
			t.Errorf("%s settled (%s, %s) with usage %+v, want %+v", id, r.State, r.SettleSource.String, r.Usage(), partsUsage)
		}
	}

	// The day the calls settled on, not UTC_DATE(): midnight may have passed since.
	today, err := testenv.SettledDay(e.ctx(), e.db, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := e.store.Usage(e.ctx(), today, today, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 || rep.Totals.CacheWrite1hTok != 3*400 || rep.Totals.AudioInTok != 3*1000 || rep.Totals.AudioOutTok != 3*250 ||
		rep.Totals.CacheWriteTok != 3*418 || rep.Totals.InTok != 3*1040 || rep.Totals.OutTok != 3*300 {
		t.Fatalf("report %+v; want one row of 3 runs' parts: 1200 one-hour writes, 3000 audio in, 750 audio out", rep)
	}
}
