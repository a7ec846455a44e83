package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestLostAdmissionOutlastingSettleTimeoutChargedNothing: README "billing_unavailable": a call
// refused 503 whose hold the database may have committed is released at 0 "once it is back".
// Here the database commits the hold, the reply is lost, and it stays out of reach past the
// release's settle_timeout, so the release gives up; the hold is left to the reconciler. The
// refused caller must still be charged nothing: a call of its own (no Idempotency-Key) has a
// zero tally for that, and so must an Idempotency-Key call, whose attempt nobody else can run
// on while its committed hold lives.
func TestLostAdmissionOutlastingSettleTimeoutChargedNothing(t *testing.T) {
	for name, hdr := range map[string]map[string]string{
		"plain":           nil,
		"idempotency-key": {proxy.IdempotencyKeyHeader: "outage-" + testenv.RandomID(4)},
	} {
		t.Run(name, func(t *testing.T) {
			// newLossyHarness, with the gateway's log observed.
			dsn, lossy := testenv.LossyMySQLDSN(t)
			db, err := holds.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			core, logs := observer.New(zap.WarnLevel)
			h := newHarnessOn(t, harnessSetup{db: db, log: zap.New(core)}, func(c *config.Config) {
				c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
			})
			u, key := h.user("standard")
			lossy.Arm("INSERT INTO run_holds (run_id, user_id, client_run_id", testenv.GoDown)
			resp := h.post(key, "/v1/chat/completions", chatBody, hdr)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" {
				lossy.Restore()
				t.Fatalf("admission with a lost commit reply and the database down: %d %s, want 503 billing_unavailable", resp.StatusCode, body)
			}
			// The release's try (settle_timeout) fails, the database still down; then it is back.
			deadline := time.Now().Add(30 * time.Second)
			for logs.FilterMessageSnippet("lost admission not released").Len() == 0 {
				if time.Now().After(deadline) {
					lossy.Restore()
					t.Fatal("the release of the lost admission did not fail within 30s with the database down")
				}
				time.Sleep(20 * time.Millisecond)
			}
			lossy.Restore()
			h.settled()
			// The hold expires (hold_ttl) and the reconciler, finding no lease, settles it.
			if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE user_id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
				Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
			if _, err := rec.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			var rows []struct {
				RunID   string `db:"run_id"`
				State   string `db:"state"`
				Held    int64  `db:"held_micro"`
				Charged int64  `db:"charged_micro"`
				Source  string `db:"settle_source"`
			}
			if err := h.db.Select(&rows, `SELECT run_id, state, held_micro, COALESCE(charged_micro, -1) AS charged_micro,
				COALESCE(settle_source, '') AS settle_source FROM run_holds WHERE user_id = ?`, u.ID); err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 || rows[0].State != string(holds.StateSettled) || rows[0].Charged != 0 {
				t.Fatalf("holds of the caller refused 503: %+v, want one, settled at 0", rows)
			}
			t.Logf("refused call's hold %s: settled by %s at %d (held %d)", rows[0].RunID, rows[0].Source, rows[0].Charged, rows[0].Held)
		})
	}
}
