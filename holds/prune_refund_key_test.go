package holds_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestPruneKeepsARunWhosePauseRefundIsKeyedByItsID: a pause refund's grant is keyed by its run's
// id (PauseRefundKey) and grants are never deleted, while an Idempotency-Key's attempt has the
// same id whenever the key is sent again (the proxy's idempotentRunID of the user, the key and
// the attempt, which is 0 once the key's record expired). Pruned, such a run freed its id: the
// key sent again long after opened its attempt 0 under the pruned run's id, and when that run too
// was charged its hold under a pause (reconcile_hold) and its call used nothing, its refund found
// the pruned run's grant under its key — the reconciler's pass skipped it as refunded, and the
// process's own refund of the same amount got the old grant back as its answer — so the user
// kept that charge for nothing. Kept, the run's id stays taken: the key's retry finds it
// settled and moves on to attempt 1, as the proxy does (passSettled), and is refunded.
func TestPruneKeepsARunWhosePauseRefundIsKeyedByItsID(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("prune-refund-key", 50, nil)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	const attempt0 = "r_idem_key_attempt0"

	// attempt admits the key's request at its first free attempt id, has it charged its hold
	// while its process is stopped, and its call come back unforwarded; it returns the run.
	attempt := func() string {
		t.Helper()
		runID := attempt0
		for i := 1; ; i++ {
			_, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
				State: holds.StateRunning, TTL: time.Hour})
			if errors.Is(err, holds.ErrRunSettled) {
				runID = attempt0 + "_" + string(rune('0'+i)) // the next attempt's id
				continue
			}
			if err != nil {
				t.Fatalf("admit %s: %v", runID, err)
			}
			break
		}
		e.expire(runID)
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
		if r := e.run(u, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
			t.Fatalf("run %s settled %q at %d; the scene is a hold charged what it held", runID, r.SettleSource.String, r.ChargedMicro)
		}
		if err := e.tally.MarkUnused(e.ctx(), runID); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
		return runID
	}
	// owed is what the user was charged for runs less what was given back to them.
	owed := func() (charged, refunded int64) {
		t.Helper()
		if err := e.db.GetContext(e.ctx(), &charged, "SELECT CAST(COALESCE(SUM(charged_micro), 0) AS SIGNED) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
		var pruned int64
		if err := e.db.GetContext(e.ctx(), &pruned, "SELECT CAST(COALESCE(SUM(charged_micro), 0) AS SIGNED) FROM pruned_runs WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
		if err := e.db.GetContext(e.ctx(), &refunded, "SELECT CAST(COALESCE(SUM(amount_micro), 0) AS SIGNED) FROM grants WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
		return charged + pruned, refunded
	}

	first := attempt()
	if c, r := owed(); c <= 0 || r != c {
		t.Fatalf("first attempt: charged %d, refunded %d; want its whole charge given back", c, r)
	}
	// Ten days on: the run, its ledger day and its tally (past tally_ttl) are old, the key's
	// record expired; a prune past every TTL runs.
	if _, err := e.db.ExecContext(e.ctx(), `UPDATE run_holds SET settled_at = settled_at - INTERVAL 10 DAY,
		created_at = created_at - INTERVAL 10 DAY WHERE user_id = ?`, u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(e.ctx(), "UPDATE usage_days SET day = day - INTERVAL 10 DAY WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(e.ctx(), e.keys.Usage(first)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.PruneSettled(e.ctx(), 8*24*time.Hour, 100); err != nil {
		t.Fatal(err)
	}

	second := attempt()
	if c, r := owed(); r != c {
		t.Errorf("after the key's second use (run %s, the first %s): charged %d, refunded %d; the second charge, for a call "+
			"that used nothing, was not given back: its refund's key was the pruned run's", second, first, c, r)
	}
}
