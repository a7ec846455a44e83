package main

import (
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
)

// TestReconcilerSettlesARunWhoseTallyIsNoRecord: a tally whose fields are no integers (a hand
// edit, a tool that wrote the hash) or past int64, or a usage key that is no hash at all, can
// never be read as a record of usage. It was read as "tally unreadable", the answer for a
// Redis blip: the hold left for the next pass, every pass failed, and so for as long as the
// key lived (tally_ttl, 48 h; for good once its TTL was removed). Such a tally is settled as
// impossible figures are (TallyBelievable): as a run without one, at its hold, logged; the
// holds beside it settle as before and the pass does not fail. So too a run without a tally
// whose admission's refusal marks are no hash: asked whether its admission was refused, the
// reconciler failed it at every pass; it is charged as a run without a mark.
func TestReconcilerSettlesARunWhoseTallyIsNoRecord(t *testing.T) {
	count := useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	keys := runstate.Keys{Prefix: prefix}
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	poisoned := map[string]func() error{
		"r_not_a_number": func() error {
			return rdb.HSet(ctx, keys.Usage("r_not_a_number"), "cost_micro", "abc", "calls", "1").Err()
		},
		"r_past_int64": func() error {
			return rdb.HSet(ctx, keys.Usage("r_past_int64"), "cost_micro", "99999999999999999999", "calls", "1").Err()
		},
		"r_not_a_hash": func() error { return rdb.Set(ctx, keys.Usage("r_not_a_hash"), "7", 0).Err() },
		// No tally, and its admission's refusal marks (a hash by its admissions' tokens) no hash.
		"r_refusals_not_a_hash": func() error { return rdb.Set(ctx, keys.Refused("r_refusals_not_a_hash"), "1", 0).Err() },
	}
	for _, poison := range poisoned {
		if err := poison(); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range []string{"r_not_a_number", "r_past_int64", "r_not_a_hash", "r_refusals_not_a_hash", "r_fine"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at, admit_token)
			 SELECT ?, id, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 SECOND, 'tok' FROM users`, run); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.HSet(ctx, keys.Usage("r_fine"), "cost_micro", "40", "calls", "1", "out_tok", "4").Err(); err != nil {
		t.Fatal(err)
	}
	_, gw := servedGateway(t, ctx)
	st, err := gw.rec.RunForced(ctx)
	if err != nil || st.ChargedHeld != len(poisoned) || st.FromTally != 1 {
		t.Fatalf("pass: %+v, %v; want the %d runs without a readable tally charged their hold, the other its tally", st, err, len(poisoned))
	}
	for run := range poisoned {
		if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = ? AND state = 'settled' AND settle_source = 'reconcile_hold' AND charged_micro = 100", run); n != 1 {
			t.Errorf("%s, whose tally is no record, not settled at its hold", run)
		}
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_fine' AND state = 'settled' AND charged_micro = 40"); n != 1 {
		t.Errorf("the run beside them not settled from its tally")
	}
}
