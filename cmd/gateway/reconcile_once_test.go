package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileOnceSaysWhichBoundStoppedIt: `reconcile -once` said "stopped at the batch
// limit" of every truncated pass, also of one its time budget stopped, sending the operator
// to look at reconcile_batch when the holds were slow. It names the bound the pass reports.
func TestReconcileOnceSaysWhichBoundStoppedIt(t *testing.T) {
	for _, tc := range []struct {
		st         holds.Stats
		want, miss string
	}{
		{holds.Stats{Scanned: 10000, Batches: 50, Truncated: true, StoppedAt: holds.StopBatchLimit}, "stopped at the batch limit; run again", "time budget"},
		{holds.Stats{Scanned: 7, Batches: 1, Truncated: true, StoppedAt: holds.StopTimeBudget}, "stopped at the time budget; run again", "batch limit"},
		{holds.Stats{Scanned: 3, Batches: 1}, "charged 0 credits", "stopped"},
		{holds.Stats{Scanned: 3, Batches: 1, ChargedHeld: 2, BroughtIn: 2}, "; 2 of them holds of dead gateway processes", "stopped"},
		{holds.Stats{Scanned: 3, Batches: 1, ChargedHeld: 2}, "charged 0 credits", "dead gateway"},
	} {
		got := passSummary(tc.st, 1_000_000)
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.miss) {
			t.Errorf("summary of %+v:\n%s\nwant %q, not %q", tc.st, got, tc.want, tc.miss)
		}
	}
}

// TestReconcileOnceTwiceScansTwice: `reconcile -once` left its lock (billing:reconcile:lock,
// 50 s) behind when it exited, under its own instance name (host:pid), so the operator's next
// `reconcile -once` within the lock's TTL said "another process holds the lock; nothing
// scanned" though no process ran, and the gateways' reconcilers waited it out. The one-off pass
// gives its lock back; a lock a serving gateway holds still stops it.
func TestReconcileOnceTwiceScansTwice(t *testing.T) {
	useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	for _, instance := range []string{"operator:101", "operator:102"} { // two runs of the command
		t.Setenv("TOLLGATE_INSTANCE", instance)
		out, err := stdout(t, func() error { return reconcileOnce(testCtx(t), []string{"-once"}) })
		if err != nil || !strings.Contains(string(out), "reconcile: scanned") {
			t.Fatalf("reconcile -once as %s: %q, %v; want a pass", instance, out, err)
		}
	}
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	if err := rdb.Set(testCtx(t), key, "gateway:7", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := stdout(t, func() error { return reconcileOnce(testCtx(t), []string{"-once"}) })
	if err != nil || !strings.Contains(string(out), "another process holds the lock") {
		t.Fatalf("reconcile -once beside a gateway holding the lock: %q, %v; want nothing scanned", out, err)
	}
	if v := rdb.Get(testCtx(t), key).Val(); v != "gateway:7" {
		t.Fatalf("lock %q after a refused one-off pass, want the gateway's kept", v)
	}
}

// TestReconcileOnceFailsOnHoldsOfDeletedUsers: a hold whose user row was deleted by hand can
// never be settled; each pass passes it over. `reconcile -once` counted it among "errors" (as a
// database failure the next pass retries) and exited 0, so a cron job or runbook that checks
// the exit status saw nothing to do. It names them and exits non-zero; a hold of a live user
// beside them is still settled.
func TestReconcileOnceFailsOnHoldsOfDeletedUsers(t *testing.T) {
	count := useTestDatabase(t)
	useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	for _, q := range []string{
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		 SELECT 'r_live', id, 'queued', 100, 100, 'm', NOW(6) - INTERVAL 1 HOUR FROM users`,
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at)
		 VALUES ('r_gone', 999999, 'running', 100, 100, 'm', NOW(6) - INTERVAL 1 HOUR)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	out, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) })
	if err == nil || !strings.Contains(err.Error(), "1 holds of users that no longer exist") {
		t.Errorf("reconcile -once over a deleted user's hold: %v; want an error naming it", err)
	}
	if !strings.Contains(string(out), "0 errors") || !strings.Contains(string(out), "1 passed over: holds of users that no longer exist") {
		t.Errorf("summary %q; want the hold passed over, not counted an error", out)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id = 'r_live' AND state = 'settled'"); n != 1 {
		t.Errorf("the live user's queued hold was not released beside the orphan")
	}
}

// TestReconcileOnceInAGatewaysEnvironment: an operator runs `reconcile -once` where a serving
// gateway's environment is (kubectl exec into its container), TOLLGATE_INSTANCE naming that
// gateway. The one-off pass took the lock as that gateway's own (the lock is re-entrant for
// its holder), scanned beside the gateway's pass, and then gave the lock back: deleted under
// the gateway, another gateway's pass started beside it. The one-off pass is a process of its
// own: while the gateway holds the lock it scans nothing, and the lock stays the gateway's.
func TestReconcileOnceInAGatewaysEnvironment(t *testing.T) {
	useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	t.Setenv("TOLLGATE_INSTANCE", "gw-a")
	key := runstate.Keys{Prefix: prefix}.ReconcileLock()
	if err := rdb.Set(testCtx(t), key, "gw-a", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := stdout(t, func() error { return reconcileOnce(testCtx(t), []string{"-once"}) })
	if err != nil || !strings.Contains(string(out), "another process holds the lock") {
		t.Errorf("reconcile -once beside gw-a holding the lock, as gw-a: %q, %v; want nothing scanned", out, err)
	}
	if v := rdb.Get(testCtx(t), key).Val(); v != "gw-a" {
		t.Fatalf("lock %q after the one-off pass, want gw-a's kept", v)
	}
}

// TestReconcileOnceRevisitWaitsALeaseTTLForATally: the revisit of a one-call run charged its
// hold (reconcile_hold) refunds from its call's tally only once the tally has stood
// holds.lease_ttl (ReconcilerConfig.RefundAfter): younger, its process, resumed from a pause,
// may still set it right. Unwired, a pass refunded on a tally just written; wired to tally_ttl,
// it refunded none within the tally's life.
func TestReconcileOnceRevisitWaitsALeaseTTLForATally(t *testing.T) {
	count := useTestDatabase(t)
	rdb, prefix := useTestRedis(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := openTestDatabase(t).ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model,
		expires_at, charged_micro, settle_source, settled_at)
		SELECT 'r_paused', id, 'settled', 20000, 20000, 'm', NOW(6) - INTERVAL 1 HOUR, 20000, 'reconcile_hold', NOW(6) FROM users`); err != nil {
		t.Fatal(err)
	}
	h := config.Default().Holds
	keys := runstate.Keys{Prefix: prefix}
	if err := runstate.NewTally(rdb, keys, h.TallyTTL).RecordCallWith(ctx, "r_paused", 1, pricing.Usage{Input: 100, Output: 90}, 900, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	refunds := func() int {
		t.Helper()
		if out, err := stdout(t, func() error { return reconcileOnce(ctx, []string{"-once"}) }); err != nil {
			t.Fatalf("reconcile -once: %v (%s)", err, out)
		}
		return count("SELECT COUNT(*) FROM grants WHERE idempotency_key = 'pause-refund:r_paused' AND amount_micro = 19100")
	}
	if n := refunds(); n != 0 {
		t.Fatalf("a tally written just now refunded (%d grants); want none until it has stood lease_ttl (%v)", n, h.LeaseTTL)
	}
	// Its write time (Redis's clock) set back past lease_ttl: a tally that has stood still.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.Usage("r_paused"), "write_ms", now.Add(-h.LeaseTTL-time.Second).UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	if n := refunds(); n != 1 {
		t.Fatalf("a tally that has stood past lease_ttl (%v): %d grants of 19100; want one", h.LeaseTTL, n)
	}
}
