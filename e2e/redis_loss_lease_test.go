package e2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestRedisLossTakesTheLeaseOfACallPastItsHold pins README "Known limits": a call that
// outlives its hold's TTL is kept from the reconciler by its lease alone, and a Redis restart
// without persistence takes that lease until the process's next heartbeat — a reconcile pass
// in that moment settles the run as a dead process's (here, a first call with no tally and
// nothing recorded on the row: its hold), and the call's own usage, ending after, is not
// charged. The heartbeat is slow here (2 s) so the pass lands in that moment for certain: the
// loss is made just after a beat, seen as the lease's TTL renewed.
func TestRedisLossTakesTheLeaseOfACallPastItsHold(t *testing.T) {
	w := newPrivateRedisWorld(t)
	config := w.writeConfig(map[string]string{"holds.hold_ttl": "3s", "holds.run_ttl": "3s", "holds.lease_ttl": "3s",
		"holds.heartbeat_interval": "1500ms", "holds.reconcile_interval": "1h", "holds.reconcile_lock_ttl": "50m"})
	_, key := w.user("lease-loss", 10, nil)
	g, err := w.tryStart("gw-lease-loss", config, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 400 events 25 ms apart: ten seconds, past the run's 3 s TTL more than twice.
	s := startStream(t, g, key, 400, 25*time.Millisecond, map[string]string{"X-Run-Id": "past-its-hold"})
	// A pass that a beat outran (the lease written again first) extends the hold instead: the
	// loss and the pass are then tried again at the next expiry, while the call lives.
	var settled holds.Run
	for attempt := 1; settled.SettleSource.String == ""; attempt++ {
		select {
		case <-s.done:
			t.Fatalf("the stream ended (%d events) before a reconcile pass after a loss settled its run (%d tries)", s.chunks, attempt-1)
		default:
		}
		w.loseRedisAfterBeat(s.runID, config)
		settled = w.hold(s.runID)
		t.Logf("try %d: the pass after the loss left the run %s (%s)", attempt, settled.State, settled.SettleSource.String)
	}
	select {
	case <-s.done:
		t.Fatalf("the stream ended before the reconcile pass (%d events): the call was not live", s.chunks)
	default:
	}
	<-s.done
	if s.err != nil || s.chunks < 400 {
		t.Fatalf("the stream broke: %d events, %v", s.chunks, s.err)
	}
	after := w.hold(s.runID)
	t.Logf("reconciled under the live call: %s, charged %d (held %d); after the call ended: %s, charged %d, %d calls",
		settled.SettleSource.String, settled.ChargedMicro, settled.HeldMicro, after.SettleSource.String, after.ChargedMicro, after.Calls)
	if settled.SettleSource.String != holds.SourceReconcileHold || settled.ChargedMicro != settled.HeldMicro {
		t.Errorf("reconcile pass after the loss: %s charged %d, want reconcile_hold at its hold %d (README Known limits)",
			settled.SettleSource.String, settled.ChargedMicro, settled.HeldMicro)
	}
	if after.ChargedMicro != settled.ChargedMicro || after.SettleSource != settled.SettleSource {
		t.Errorf("the run was charged again when its call ended: %s %d, then %s %d",
			settled.SettleSource.String, settled.ChargedMicro, after.SettleSource.String, after.ChargedMicro)
	}
}

// loseRedisAfterBeat waits until run's hold has expired and a heartbeat has just renewed its
// lease, then makes Redis lose everything (FLUSHALL) and runs the operator's reconcile pass,
// which the next beat, most of a heartbeat interval away, should not outrun.
func (w *world) loseRedisAfterBeat(runID, config string) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(8 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no fresh lease on an expired hold within 8 s (expires %s, now %s)", w.hold(runID).ExpiresAt, w.dbNow())
		}
		// The beat writes the lease with a 3 s TTL: above 2.8 s, it has just been written.
		if ttl, err := w.rdb.PTTL(ctx, w.keys.Lease(runID)).Result(); err == nil && ttl > 2800*time.Millisecond &&
			w.hold(runID).ExpiresAt.Before(w.dbNow()) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := w.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "reconcile", "-once", "-force", "-config", config)
	cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+w.redisURL, "UPSTREAM_URL="+w.upstream.URL,
		"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gateway reconcile -once -force: %v\n%s", err, out)
	}
}
