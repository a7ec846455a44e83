package holds_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordRunCallNeverShortensAnExpiry: a call's record on its run's row pushes the run's
// expiry out to now + ttl, never earlier than it is: the record of a call that ended lands
// after a later call's admission may have pushed the run further out, and a record that
// pulled it back in left the run to be reconciled under that later call.
func TestRecordRunCallNeverShortensAnExpiry(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_ttl", 3, nil)
	h := e.admit(u, "x_rec_ttl", holds.StateRunning) // expires in an hour
	before := e.run(u, h.RunID).ExpiresAt
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	if after := e.run(u, h.RunID).ExpiresAt; after.Before(before) {
		t.Fatalf("recording a call with a minute's TTL moved the expiry from %v to %v", before, after)
	}
}

// TestRecordRunCallLeavesASettledRunAlone: a call's record that lands after its run settled
// (the settlement came between the call's tally and its record) changes nothing on the row:
// a settled row's figures are what was charged, and the usage report, the audits and
// pruned_runs sum them.
func TestRecordRunCallLeavesASettledRunAlone(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_settled", 3, nil)
	h := e.admit(u, "x_rec_settled", holds.StateRunning)
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, Usage: pricing.Usage{Input: 100, Output: 10},
		CostMicro: 700, Calls: 1, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	settled := e.run(u, h.RunID)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 50, Output: 5}, 350, 1, true); err != nil || ok {
		t.Fatalf("record of a call of a settled run: %v, %v; want not recorded", ok, err)
	}
	r := e.run(u, h.RunID)
	if r.State != holds.StateSettled || r.CostMicro != settled.CostMicro || r.InTok != settled.InTok || r.OutTok != settled.OutTok ||
		r.Calls != settled.Calls || r.EndedCalls != settled.EndedCalls || r.Estimated != settled.Estimated || !r.ExpiresAt.Equal(settled.ExpiresAt) {
		t.Fatalf("settled run %+v changed by a late record to %+v", settled, r)
	}
}

// TestRecordRunCallOfAMissingRunOnAUsedConnectionIsNotRecorded: a record's script keeps what it
// found in session variables, which outlive it on a pooled connection. A record of a run with
// no row (none by that id) finds nothing to read into them, and must not take what an earlier
// record of a live run left there: it records nothing, and says the run is not live. Mutant:
// the variables not reset first (the missing run's call taken as recorded on a live run, and a
// key of it left in run_calls).
func TestRecordRunCallOfAMissingRunOnAUsedConnectionIsNotRecorded(t *testing.T) {
	e := newStoreEnv(t)
	e.db.SetMaxOpenConns(1) // every script on the one connection
	u := e.user("rec_missing", 3, nil)
	h := e.admit(u, "x_rec_live", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 50, Output: 5}, 350, 1, false); err != nil || !ok {
		t.Fatalf("record of a call of a live run: %v, %v; want recorded", ok, err)
	}
	missing := "x_rec_missing_" + token.New()[:8]
	if ok, err := e.store.RecordRunCall(e.ctx(), missing, token.New(), time.Minute, pricing.Usage{Input: 50, Output: 5}, 350, 1, false); err != nil || ok {
		t.Fatalf("record of a call of a run with no row: %v, %v; want not recorded", ok, err)
	}
	var keys int
	if err := e.db.Get(&keys, "SELECT COUNT(*) FROM run_calls WHERE run_id = ?", missing); err != nil || keys != 0 {
		t.Fatalf("%d keys of calls of a run with no row (%v); want none", keys, err)
	}
}
