package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
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
	rdb, prefix := testenv.Redis(t)
	t.Setenv("REDIS_URL", testenv.RedisURL(t))
	t.Setenv("TOLLGATE_REDIS_PREFIX", prefix)
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
