package e2e

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestRedisLossTakesTheLeaseOfACallPastItsHold pins README "Known limits": a call that
// outlives its hold's TTL is kept from the reconciler by its lease alone, and a Redis restart
// without persistence takes that lease until the process's next heartbeat — another process's
// reconcile pass in that moment (here the operator's `reconcile -once`; the serving process's
// own knows its calls whatever Redis says) settles the run as a dead process's (here, a first
// call with no tally and nothing recorded on the row: its hold), and the call's own usage,
// ending after, is not charged. The heartbeat is slow here (4 s) so the pass lands in that
// moment: the loss is made just after a beat, seen as the lease's TTL renewed, and the one-off
// process has most of the interval to start and scan. The call is held mid-stream by the test
// until the pass has settled its run, so every try the pass needs finds it live.
func TestRedisLossTakesTheLeaseOfACallPastItsHold(t *testing.T) {
	w := newPrivateRedisWorld(t)
	const leaseTTL = 8 * time.Second
	config := w.writeConfig(map[string]string{"holds.hold_ttl": "8s", "holds.run_ttl": "8s", "holds.lease_ttl": leaseTTL.String(),
		"holds.heartbeat_interval": "4s", "holds.reconcile_interval": "1h", "holds.reconcile_lock_ttl": "50m"})
	_, key := w.user("lease-loss", 10, nil)
	g, err := w.tryStart("gw-lease-loss", config, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The stream stays after its first event until the pass has settled its run: paced alone
	// (it was 400 events 25 ms apart, ten seconds), a loaded machine's slow passes could use up
	// its life in two or three tries.
	held, letGo := w.holdStreams("past-its-hold", map[string]string{"X-Run-Id": "past-its-hold"})
	const events = 40
	s := startStream(t, g, key, events, 25*time.Millisecond, held)
	// A pass that a beat outran (the lease written again first) extends the hold instead: the
	// loss and the pass are then tried again at the next expiry, while the call lives.
	const tries = 5
	var settled holds.Run
	for attempt := 1; settled.SettleSource.String == ""; attempt++ {
		if attempt > tries {
			t.Fatalf("no reconcile pass after a loss settled the run in %d tries: each was outrun by a heartbeat", tries)
		}
		select {
		case <-s.done:
			t.Fatalf("the stream ended (%d events, %v) while held, before a reconcile pass after a loss settled its run (%d tries)", s.chunks, s.err, attempt-1)
		default:
		}
		w.loseRedisAfterBeat(s.runID, config, leaseTTL)
		settled = w.hold(s.runID)
		t.Logf("try %d: the pass after the loss left the run %s (%s)", attempt, settled.State, settled.SettleSource.String)
	}
	select {
	case <-s.done:
		t.Fatalf("the stream ended before the reconcile pass (%d events, %v): the call was not live", s.chunks, s.err)
	default:
	}
	letGo()
	<-s.done
	if s.err != nil || s.chunks < events {
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
// lease (written with leaseTTL), then makes Redis lose everything (FLUSHALL) and runs the
// operator's reconcile pass, which the next beat, most of a heartbeat interval away, should
// not outrun.
func (w *world) loseRedisAfterBeat(runID, config string, leaseTTL time.Duration) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	// The hold expires within its TTL (8 s) of its admission or last extension; a beat
	// follows within one interval (4 s).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no fresh lease on an expired hold within 30 s (expires %s, now %s)", w.hold(runID).ExpiresAt, w.dbNow())
		}
		// The lease is read last, just before the loss: within 200 ms of its TTL, a beat has
		// just written it.
		if w.hold(runID).ExpiresAt.Before(w.dbNow()) {
			if ttl, err := w.rdb.PTTL(ctx, w.keys.Lease(runID)).Result(); err == nil && ttl > leaseTTL-200*time.Millisecond {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := w.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := testenv.DiesWithTests(exec.Command(gatewayBin, "reconcile", "-once", "-force", "-config", config))
	cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+w.redisURL, "UPSTREAM_URL="+w.upstream.URL,
		"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gateway reconcile -once -force: %v\n%s", err, out)
	}
	t.Logf("the loss and the pass: the pass took %s", time.Since(start).Round(time.Millisecond))
}
