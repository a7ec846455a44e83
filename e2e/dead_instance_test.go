package e2e

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestKilledProcessSettledLongBeforeItsHoldsExpire: a sidecar gateway is SIGKILLed with two
// calls streaming (one under an Idempotency-Key), the caller's two in-flight slots both taken.
// Its holds would expire after hold_ttl (10 minutes here); the other gateway's reconciler
// finds the dead process's heartbeat stale past holds.dead_instance_after (8 s) and settles
// both calls at their holds within seconds. The caller then works on at once: two calls fit
// again, and the key's retry runs as a new attempt instead of 409 request_in_progress. The
// surviving gateway, stopped with SIGTERM, retires its own row.
func TestKilledProcessSettledLongBeforeItsHoldsExpire(t *testing.T) {
	w := newWorld(t)
	u, key := w.user("sidecar", 2, nil)
	cfg := w.longHoldsConfig("holds.dead_instance_after", "8s")
	b := w.startGatewayWith("gw-b", cfg) // beats all along, so its reconciler may declare others dead
	a := w.startGatewayWith("gw-a", cfg)

	idem := map[string]string{"Idempotency-Key": "sidecar-retry"}
	plain := startStream(t, a, key, 5000, 20*time.Millisecond, nil)
	keyed := startStream(t, a, key, 5000, 20*time.Millisecond, idem)
	waitFor(t, 10*time.Second, "both calls' leases", func() bool { return len(w.leaseKeys()) == 2 })
	if r := <-sendAsync(context.Background(), b, key, chatBody(false, 10, "a third call"), nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("third call with both slots taken: %d %s, want 429", r.status, r.body)
	}

	killAt := w.dbNow()
	a.signal(t, syscall.SIGKILL)
	<-plain.done
	<-keyed.done
	// Within a minute: the holds would expire in ten.
	waitFor(t, 60*time.Second, "the killed calls to be settled", func() bool {
		return w.hold(plain.runID).State == holds.StateSettled && w.hold(keyed.runID).State == holds.StateSettled
	})
	for _, id := range []string{plain.runID, keyed.runID} {
		r := w.hold(id)
		if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != r.HeldMicro {
			t.Errorf("killed call %s: %q charged %d, want reconcile_hold at its hold %d", id, r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
		}
		t.Logf("MEASURED: killed call %s settled %v after the SIGKILL (hold_ttl %v)", id, r.SettledAt.Time.Sub(killAt).Round(time.Millisecond), longHoldTTL)
	}

	// The caller's slots are free: two calls at once are served, and the key's retry runs as
	// a new attempt.
	one := sendAsync(context.Background(), b, key, chatBody(false, 10, "first after the kill"), map[string]string{"X-Fake-Chunks": "40"})
	retry := <-sendAsync(context.Background(), b, key, chatBody(true, 5010, "stream please"), with(idem, "X-Fake-Chunks", "20"))
	if r := <-one; r.status != http.StatusOK {
		t.Errorf("call after the kill: %d %s, want 200", r.status, r.body)
	}
	if retry.status != http.StatusOK || retry.runID == keyed.runID {
		t.Errorf("the key's retry after the kill: %d run %s %.200s, want 200 as a new attempt", retry.status, retry.runID, retry.body)
	}

	metrics := scrape(t, b)
	if got := metricValue(metrics, "tollgate_dead_instances_total"); got != 1 {
		t.Errorf("gw-b tollgate_dead_instances_total = %v, want 1", got)
	}
	rows, err := w.store.ListInstances(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Errorf("instance rows %+v, want gw-a's and gw-b's", rows)
	}
	for _, r := range rows {
		if dead := r.DeadAt.Valid && r.SweptAt.Valid; dead != (r.Name == "gw-a") {
			t.Errorf("instance row %+v: want gw-a's dead and swept, gw-b's alive", r)
		}
	}

	// A gateway that does not take part keeps no row and stamps nothing: its holds wait for
	// their expiry, as before the rows existed.
	off := w.startGatewayWith("gw-off", w.longHoldsConfig("holds.find_dead_instances", "false"))
	offRun, _ := completeCall(t, off, key, chatBody(false, 10, "not taking part"), nil)
	waitFor(t, 10*time.Second, "the call on gw-off to settle", func() bool { return w.hold(offRun).State == holds.StateSettled })
	var stamped, offRows int
	if err := w.db.Get(&stamped, "SELECT COUNT(*) FROM run_holds WHERE run_id = ? AND served_by IS NOT NULL", offRun); err != nil {
		t.Fatal(err)
	}
	if err := w.db.Get(&offRows, "SELECT COUNT(*) FROM instances WHERE name = 'gw-off'"); err != nil {
		t.Fatal(err)
	}
	if stamped != 0 || offRows != 0 {
		t.Errorf("gw-off: %d holds stamped, %d instance rows; want none", stamped, offRows)
	}
	off.signal(t, syscall.SIGTERM)
	if err := off.wait(t, 30*time.Second); err != nil {
		t.Fatalf("gw-off after SIGTERM: %v", err)
	}

	b.signal(t, syscall.SIGTERM)
	if err := b.wait(t, 30*time.Second); err != nil {
		t.Fatalf("gw-b after SIGTERM: %v", err)
	}
	rows, err = w.store.ListInstances(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if !r.DeadAt.Valid {
			t.Errorf("instance row %+v alive after its process stopped, want retired", r)
		}
	}
	waitFor(t, 10*time.Second, "every hold settled", func() bool { return w.liveHolds() == 0 })
	var total int64
	if err := w.db.Get(&total, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.ledgerUsed(u.ID); got != total {
		t.Errorf("day ledger %d, want the sum of settled charges %d", got, total)
	}
}

// TestProcessCutOffFromTheDatabaseIsNotChargedAsDead: a gateway cut off from MariaDB alone (its
// packets dropped) stops beating and is declared dead by the other, but its stream keeps its
// lease in Redis, so its hold is left alone: no settlement under it, its expiry unchanged.
// Once the database is back the stream ends and its own process settles it at what it used,
// and the process, finding its row dead, registers a new one.
func TestProcessCutOffFromTheDatabaseIsNotChargedAsDead(t *testing.T) {
	w := newWorld(t)
	_, key := w.user("cut-off", 3, nil)
	cfg := w.longHoldsConfig("holds.dead_instance_after", "8s")
	b := w.startGatewayWith("gw-b", cfg)
	f := newFreezer(t, w.mysqlAddr())
	a := w.startGatewayWith("gw-a", cfg, "MYSQL_DSN="+w.dsnVia(f))

	s := startStream(t, a, key, 1200, 20*time.Millisecond, nil)
	waitFor(t, 10*time.Second, "the stream's lease", func() bool { return len(w.leaseKeys()) == 1 })
	before := w.hold(s.runID)
	f.freeze()
	waitFor(t, 30*time.Second, "gw-a declared dead", func() bool {
		var dead int
		_ = w.db.Get(&dead, "SELECT COUNT(*) FROM instances WHERE name = 'gw-a' AND dead_at IS NOT NULL")
		return dead == 1
	})
	// Three more of gw-b's passes (every testReconcile) find the stream leased.
	const passes = `tollgate_reconcile_passes_total{result="done"}`
	from := max(0, metricValue(scrape(t, b), passes))
	waitFor(t, 60*time.Second, "three more passes of gw-b", func() bool { return metricValue(scrape(t, b), passes) >= from+3 })
	if r := w.hold(s.runID); r.State != holds.StateRunning || !r.ExpiresAt.Equal(before.ExpiresAt) {
		t.Fatalf("stream of a process cut off from the database: %s by %q, expiring %v (was %v); want running, untouched",
			r.State, r.SettleSource.String, r.ExpiresAt, before.ExpiresAt)
	}
	f.thaw()
	<-s.done
	if s.err != nil || s.chunks < 1200 {
		t.Fatalf("stream ended with %v after %d of 1200 events, want its whole answer", s.err, s.chunks)
	}
	waitFor(t, 30*time.Second, "the stream's settlement", func() bool { return w.hold(s.runID).State == holds.StateSettled })
	r := w.hold(s.runID)
	if r.SettleSource.String != holds.SourceComplete || r.Estimated || r.ChargedMicro != r.CostMicro || r.CostMicro == r.HeldMicro {
		t.Errorf("stream settled by %q (estimated %v) charged %d of cost %d, held %d; want its own complete settlement at its cost",
			r.SettleSource.String, r.Estimated, r.ChargedMicro, r.CostMicro, r.HeldMicro)
	}
	waitFor(t, 30*time.Second, "gw-a registered again", func() bool {
		var alive int
		_ = w.db.Get(&alive, "SELECT COUNT(*) FROM instances WHERE name = 'gw-a' AND dead_at IS NULL")
		return alive == 1
	})
}

// longHoldTTL is the hold_ttl and run_ttl of longHoldsConfig: past any of these tests, so that
// a hold settled while they run was settled because its process was found dead.
const longHoldTTL = 10 * time.Minute

// longHoldsConfig is a config file with holds of longHoldTTL (and the tally's TTL to match)
// and one more setting.
func (w *world) longHoldsConfig(key, value string) string {
	w.t.Helper()
	return w.writeConfig(map[string]string{"holds.hold_ttl": longHoldTTL.String(), "holds.run_ttl": longHoldTTL.String(),
		"holds.tally_ttl": "2h", key: value})
}
