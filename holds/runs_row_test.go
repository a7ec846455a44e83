package holds_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/pricing"
)

// TestRecordRunCallOfACallThatUsedNothingCountsItEndedOnly: a call of a named run that used
// nothing (calls 0) is recorded as ended but not among the calls that used something, which
// the settlement and the usage report count. Mutant: calls = calls + 1 whatever the call
// said (a failed call counted as a call of the run's bill).
func TestRecordRunCallOfACallThatUsedNothingCountsItEndedOnly(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_nothing", 3, nil)
	h := e.admit(u, "x_rec_nothing", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{}, 0, 0, false); err != nil || !ok {
		t.Fatalf("record of a call that used nothing: %v, %v", ok, err)
	}
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record of a call that used something: %v, %v", ok, err)
	}
	if r := e.run(u, h.RunID); r.Calls != 1 || r.EndedCalls != 2 || r.CostMicro != 70 {
		t.Fatalf("run's row %+v after a call that used nothing and one that used 70: want 1 call, 2 ended, cost 70", r)
	}
}

// TestRecordRunCallExpiryIsNowPlusTheTTL: a record on a run whose expiry is near pushes it out
// to the record's own TTL from now, by the database clock, and no further. Mutant: the TTL in
// milliseconds where the statement takes microseconds (a run TTL of an hour became 3.6 s).
func TestRecordRunCallExpiryIsNowPlusTheTTL(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_expiry", 3, nil)
	h := e.admit(u, "x_rec_expiry", holds.StateRunning)
	e.expire(h.RunID)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Hour, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	if r := e.run(u, h.RunID); r.ExpiresAt.Sub(r.ReadAt) < 59*time.Minute || r.ExpiresAt.Sub(r.ReadAt) > time.Hour {
		t.Fatalf("run recorded with a TTL of an hour expires %v after it was read; want an hour", r.ExpiresAt.Sub(r.ReadAt))
	}
}

// TestRecordRunCallKeysACallByItsRun: a call id is its caller's own, unique within its run
// only: the same id recorded on two runs is a call of each. Mutant: the call's key looked up
// by call id alone (the second run's call taken as recorded, its figures lost).
func TestRecordRunCallKeysACallByItsRun(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_two_runs", 3, nil)
	callID := token.New()
	for _, id := range []string{"x_rec_two_a", "x_rec_two_b"} {
		e.admit(u, id, holds.StateRunning)
		if ok, err := e.store.RecordRunCall(e.ctx(), id, callID, time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
			t.Fatalf("record on %s: %v, %v", id, ok, err)
		}
		if r := e.run(u, id); r.Calls != 1 || r.CostMicro != 70 {
			t.Fatalf("run %s records %d calls costing %d after its call; want 1 costing 70", id, r.Calls, r.CostMicro)
		}
	}
}

// TestRecordRunCallClampsItsUsage: a provider's usage report is the provider's word: a
// negative count (a bug on its side) is recorded as 0, so the row stays a record its
// settlement can believe (RecordBelievable). Mutant: the usage not clamped (the row's
// negative figure made it no record, and its calls' usage was lost with a Redis restart).
func TestRecordRunCallClampsItsUsage(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_clamp", 3, nil)
	h := e.admit(u, "x_rec_clamp", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, token.New(), time.Minute, pricing.Usage{Input: -5, Output: 10}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	r := e.run(u, h.RunID)
	if r.InTok != 0 || r.OutTok != 10 || !r.RecordBelievable() {
		t.Fatalf("run's row %+v after a call reporting -5 input tokens: want 0 input, 10 output, a believable record", r)
	}
}

// TestRecordRunCallTakesACallIDOfTheLongestLength: run_calls.call_id takes 64 characters,
// and a call id that long is recorded. Mutant: the bound off by one (the call's record
// panicked the process).
func TestRecordRunCallTakesACallIDOfTheLongestLength(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("rec_long_id", 3, nil)
	h := e.admit(u, "x_rec_long_id", holds.StateRunning)
	if ok, err := e.store.RecordRunCall(e.ctx(), h.RunID, strings.Repeat("c", 64), time.Minute, pricing.Usage{Input: 10, Output: 1}, 70, 1, false); err != nil || !ok {
		t.Fatalf("record with a call id of 64 characters: %v, %v", ok, err)
	}
	if r := e.run(u, h.RunID); r.Calls != 1 {
		t.Fatalf("run records %d calls after a call with a 64-character id, want 1", r.Calls)
	}
}

// TestStoreRunOfAnotherUserIsNotFound: a run read by another user is ErrRunNotFound, as one
// that does not exist, so run ids cannot be probed. Mutant: the user not in the WHERE.
func TestStoreRunOfAnotherUserIsNotFound(t *testing.T) {
	e := newStoreEnv(t)
	owner, other := e.user("run_owner", 3, nil), e.user("run_other", 3, nil)
	h := e.admit(owner, "r_owned", holds.StateRunning)
	if r, err := e.store.Run(e.ctx(), other.ID, h.RunID); !errors.Is(err, holds.ErrRunNotFound) {
		t.Fatalf("another user's run read: %+v, %v; want ErrRunNotFound", r, err)
	}
	if _, err := e.store.Run(e.ctx(), owner.ID, "r_never_"+testenv.RandomID(6)); !errors.Is(err, holds.ErrRunNotFound) {
		t.Fatalf("a run that does not exist read: %v; want ErrRunNotFound", err)
	}
}

// TestStoreRunCarriesItsAdmissionsToken: Store.Run reads the token of the admission that
// inserted the hold, which a release by token compares with its own to tell its hold's
// charge. Mutant: the token not read.
func TestStoreRunCarriesItsAdmissionsToken(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("run_token", 3, nil)
	tok := testenv.RandomID(16)
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: "r_tokened_read", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour, Token: tok}); err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, "r_tokened_read"); !r.AdmitToken.Valid || r.AdmitToken.String != tok {
		t.Fatalf("run read with admission token %+v, want %q", r.AdmitToken, tok)
	}
}

// TestRunAgeIsByTheDatabaseClock: a run's age is from its created_at to when Store.Run read it,
// both by the database clock. Mutants: the read time taken from created_at (every run 0 old:
// an Idempotency-Key replay window never closed), the difference the wrong way round.
func TestRunAgeIsByTheDatabaseClock(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("run_age", 3, nil)
	h := e.admit(u, "r_aged", holds.StateRunning)
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET created_at = NOW(6) - INTERVAL 1 HOUR WHERE run_id = ?", h.RunID); err != nil {
		t.Fatal(err)
	}
	if age := e.run(u, h.RunID).Age(); age < time.Hour || age > time.Hour+time.Minute {
		t.Fatalf("run created an hour ago is %v old, want an hour", age)
	}
}

// TestRunAgeOfARunNotReadByStoreRunPanics: a run from a read that does not take the database
// clock has no age to tell; Age says so rather than measure from the zero time. Mutant: no
// check (an age of minus two thousand years).
func TestRunAgeOfARunNotReadByStoreRunPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Age of a run with no read time did not panic")
		}
	}()
	_ = holds.Run{CreatedAt: time.Now()}.Age()
}

// TestExtendLeavesASettledRunAlone: the reconciler's extension of a leased hold that a
// settlement beat to it moves nothing: a settled row's expiry is history. Mutant: the state
// not in the WHERE (a settled run's row moved and reported moved).
func TestExtendLeavesASettledRunAlone(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("extend_settled", 3, nil)
	h := e.admit(u, "r_extend_settled", holds.StateRunning)
	e.expire(h.RunID)
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	before := e.run(u, h.RunID).ExpiresAt
	if moved, err := e.store.Extend(e.ctx(), h.RunID, time.Hour); err != nil || moved {
		t.Fatalf("extend of a settled run: moved %v, %v; want not moved", moved, err)
	}
	if after := e.run(u, h.RunID).ExpiresAt; !after.Equal(before) {
		t.Fatalf("settled run's expiry moved from %v to %v by an extension", before, after)
	}
}

// TestExtendMovesAnExpiredQueuedHold: a queued hold is live, and a leased one the reconciler
// extends as a running one. Mutant: only a running hold extended (the queued hold, still
// leased, settled as never forwarded under its live process).
func TestExtendMovesAnExpiredQueuedHold(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("extend_queued", 3, nil)
	h := e.admit(u, "r_extend_queued", holds.StateQueued)
	e.expire(h.RunID)
	if moved, err := e.store.Extend(e.ctx(), h.RunID, time.Hour); err != nil || !moved {
		t.Fatalf("extend of an expired queued hold: moved %v, %v; want moved", moved, err)
	}
	if r := e.run(u, h.RunID); r.ExpiresAt.Sub(r.ReadAt) < 59*time.Minute {
		t.Fatalf("queued hold extended by an hour expires %v after it was read", r.ExpiresAt.Sub(r.ReadAt))
	}
	if _, err := e.store.Settle(e.ctx(), holds.Settlement{RunID: h.RunID, Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileScanMergesTheStatesOldestFirst: the scan reads each live state apart and the
// database merges the two oldest first, so the cursor it goes on from passes no older hold of
// the other state. Here the running hold expired first but its run id sorts after the queued
// one's, in batches of one. Mutants: the merge ordered by run id, or not ordered (the queued
// part first): the queued hold read first, the cursor past the running one's expiry, which
// that pass then never read.
func TestReconcileScanMergesTheStatesOldestFirst(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("scan_merge", 5, nil)
	queued := e.admit(u, "r_merge_a", holds.StateQueued)
	running := e.admit(u, "r_merge_b", holds.StateRunning)
	e.addTally(running.RunID, pricing.Usage{Input: 10, Output: 1}, 1_000)
	for id, ago := range map[string]string{queued.RunID: "1 MINUTE", running.RunID: "1 HOUR"} {
		if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL "+ago+" WHERE run_id = ?", id); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.pass(e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Batch, c.MaxBatches = 1, 5 }))
	if err != nil {
		t.Fatal(err)
	}
	if st.Scanned != 2 || st.Released != 1 || st.FromTally != 1 {
		t.Errorf("pass in batches of one over an older running hold and a newer queued one: %+v; want both read and settled", st)
	}
	if r := e.run(u, running.RunID); r.State != holds.StateSettled || r.ChargedMicro != 1_000 {
		t.Errorf("older running hold: %s, charged %d; want settled from its tally at 1000", r.State, r.ChargedMicro)
	}
}

// TestReconcileFromTheRowCountsOnlyTheCallsThatUsedSomething: a named run settled from its
// row (its tally lost with a Redis restart) is charged the calls that used something, as its
// tally would have counted them, not every call that ended. Mutant: Recorded's calls read
// from ended_calls (the run billed a call that failed).
func TestReconcileFromTheRowCountsOnlyTheCallsThatUsedSomething(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("row_calls", 20, nil)
	run := e.admit(u, "x_row_calls", holds.StateRunning)
	for _, c := range []struct {
		u     pricing.Usage
		cost  int64
		calls int
	}{{pricing.Usage{}, 0, 0}, {pricing.Usage{Input: 100, Output: 10}, 700, 1}} {
		if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, c.u, c.cost, c.calls, false); err != nil {
			t.Fatal(err)
		}
	}
	e.expire(run.RunID)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.Calls != 1 || r.ChargedMicro != 700 {
		t.Errorf("run %+v (pass %+v): want settled from its row, 1 call charged 700", r, st)
	}
}

// TestReconcileRowOfBeforeEndedCallsIsARecord: a live named run's row written by a gateway of
// before migration 007 counts its calls but no ended calls (the column's default, 0). A free
// model's run of them, its tally lost, is settled from that row at 0 with its calls. Mutant:
// only ended calls or a cost taken as a record (the run charged its whole hold).
func TestReconcileRowOfBeforeEndedCallsIsARecord(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("row_pre_007", 20, nil)
	run := e.admit(u, "x_row_pre_007", holds.StateRunning)
	for range 2 {
		if _, err := e.store.RecordRunCall(e.ctx(), run.RunID, token.New(), time.Minute, pricing.Usage{Input: 100, Output: 10}, 0, 1, false); err != nil {
			t.Fatal(err)
		}
	}
	// As a gateway of before 007 left the row.
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET ended_calls = 0 WHERE run_id = ?", run.RunID); err != nil {
		t.Fatal(err)
	}
	e.expire(run.RunID)
	st, err := e.pass(e.reconciler("me", nil))
	if err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, run.RunID); r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 0 || r.Calls != 2 {
		t.Errorf("run %+v (pass %+v): want settled from its row at 0 with its 2 calls", r, st)
	}
}
