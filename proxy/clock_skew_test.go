package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// skewedDB is a fresh test database whose clock stands still at the gateway's clock plus
// skew: every session of the handle runs at that instant (the driver sends SET timestamp), so
// the gateway process and the database disagree on the time by skew, as two machines whose
// clocks drifted apart do. The database clock is the only clock for expiry (DESIGN §7).
func skewedDB(t *testing.T, skew time.Duration) *sqlx.DB {
	t.Helper()
	at := time.Now().Add(skew)
	db := testenv.Open(t, testenv.DSNAt(t, testenv.MySQLDSN(t), at))
	return db
}

// TestRunSettleAgeIsTheDatabasesClock: a named run settled on request without any tally is
// busy while it is younger than the longest call (its first call may be between its
// admission and its reservation), else charged what it held. Its age is measured from its
// created_at, a database time, so by the database clock: measured by the gateway's clock, a
// gateway running ahead of the database charged a run admitted a moment ago its whole hold
// (and its first call was then refused as settled), and a gateway running behind answered
// run_busy for the skew's length to a run long past any call.
func TestRunSettleAgeIsTheDatabasesClock(t *testing.T) {
	lostEvidence := func(h *harness, runID string) {
		t.Helper()
		if err := h.rdb.Del(context.Background(), h.keys.Usage(runID)).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
			cache_write_tok = 0, out_tok = 0, ended_calls = 0 WHERE run_id = ?`, runID); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("gateway ahead of the database", func(t *testing.T) {
		h := newHarnessOn(t, harnessSetup{db: skewedDB(t, -time.Hour)}, nil)
		u, key := h.user("standard")
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-young"})
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get(proxy.RunIDHeader)
		h.settled()
		lostEvidence(h, runID)
		// By the database clock the run was admitted just now.
		if status, body := h.settleRun(key, "task-young"); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
			r := h.run(u.ID, runID)
			t.Fatalf("settle of a run admitted a moment ago (database clock), gateway clock 1h ahead: %d %s, run %+v; want 409 run_busy",
				status, body, r)
		}
	})
	t.Run("gateway behind the database", func(t *testing.T) {
		h := newHarnessOn(t, harnessSetup{db: skewedDB(t, time.Hour)}, nil)
		u, key := h.user("standard")
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-old"})
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get(proxy.RunIDHeader)
		h.settled()
		lostEvidence(h, runID)
		// By the database clock the run is older than any call can be (the default longest
		// call is 7 minutes); by the gateway's it is not born yet.
		if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 10 MINUTE WHERE run_id = ?", runID); err != nil {
			t.Fatal(err)
		}
		status, body := h.settleRun(key, "task-old")
		r := h.run(u.ID, runID)
		if status != http.StatusOK || r.ChargedMicro != r.HeldMicro || r.HeldMicro == 0 || !r.Estimated {
			t.Fatalf("settle of a run 10 minutes old (database clock), gateway clock 1h behind: %d %s, run %+v; want charged what it held",
				status, body, r)
		}
	})
}

// TestIdemReplayTTLIsTheDatabasesClock: when Redis has lost the record of an idempotent
// attempt that pinned its key, the key stays pinned (409 idempotent_response_lost, nothing run
// or charged again) until replay_ttl has passed since the attempt began; after that the
// record is taken as expired and the key is free. created_at is a database time, so the
// replay_ttl since it is measured by the database clock: measured by the gateway's, a gateway
// running ahead of the database ran and charged a pinned request a second time, and one
// running behind kept refusing a key whose replay_ttl had passed.
func TestIdemReplayTTLIsTheDatabasesClock(t *testing.T) {
	const replayTTL = 30 * time.Minute
	lose := func(h *harness) {
		t.Helper()
		ctx := context.Background()
		recs, err := h.rdb.Keys(ctx, h.keys.Prefix+"replay:*").Result()
		if err != nil || len(recs) == 0 {
			t.Fatalf("replay records: %v %v", recs, err)
		}
		if err := h.rdb.Del(ctx, recs...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("gateway ahead of the database", func(t *testing.T) {
		h := newHarnessOn(t, harnessSetup{db: skewedDB(t, -time.Hour)}, func(c *config.Config) { c.Dedup.ReplayTTL = replayTTL })
		u, key := h.user("standard")
		idem := map[string]string{proxy.IdempotencyKeyHeader: "nightly-1"}
		a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
		h.settled()
		lose(h)
		calls := h.fake.Calls()
		b := send(h.gw.URL, key, chatBody, idem)
		h.settled()
		if n := h.fake.Calls(); n != calls || b.status != http.StatusConflict {
			t.Fatalf("retry a moment after the attempt settled (database clock), gateway clock 1h ahead, record lost: %d %s, upstream calls %d -> %d; want 409, no new call",
				b.status, b.body, calls, n)
		}
		h.expectCharges(u.ID, []string{a.header.Get(proxy.RunIDHeader)}) // nor charged again
	})
	t.Run("gateway behind the database", func(t *testing.T) {
		h := newHarnessOn(t, harnessSetup{db: skewedDB(t, time.Hour)}, func(c *config.Config) { c.Dedup.ReplayTTL = replayTTL })
		_, key := h.user("standard")
		idem := map[string]string{proxy.IdempotencyKeyHeader: "nightly-2"}
		a := sendOK(t, "first", h.gw.URL, key, chatBody, idem)
		h.settled()
		lose(h)
		// By the database clock the attempt began and settled longer than replay_ttl ago.
		if _, err := h.db.Exec(`UPDATE run_holds SET created_at = created_at - INTERVAL 31 MINUTE,
			settled_at = settled_at - INTERVAL 31 MINUTE WHERE run_id = ?`,
			a.header.Get(proxy.RunIDHeader)); err != nil {
			t.Fatal(err)
		}
		// The ledger's day follows settled_at (the audit at cleanup checks it): moved back
		// across midnight, the charge moves with it.
		if _, err := h.db.Exec(`UPDATE usage_days d JOIN run_holds h ON h.user_id = d.user_id AND h.run_id = ?
			SET d.day = DATE(h.settled_at)`, a.header.Get(proxy.RunIDHeader)); err != nil {
			t.Fatal(err)
		}
		b := send(h.gw.URL, key, chatBody, idem)
		h.settled()
		if b.status != http.StatusOK {
			t.Fatalf("retry 31 minutes after the attempt began and settled (database clock), replay_ttl 30m, gateway clock 1h behind: %d %s; want it run",
				b.status, b.body)
		}
	})
}
