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
)

// TestLostAdmissionReleaseThatGivesUpLeavesAZeroTally: a plain call refused 503 whose hold the
// database committed (the reply lost) is released at 0, retried while the hold lives. When the
// database stays out of reach for the hold's whole life the release gives up, and the
// reconciler settles the expired hold from its tally: the zero tally written first for the
// fresh run id is what keeps the refused caller from being charged what was held. Mutant: the
// zero tally skipped (`if ar.Fresh` -> `if false`); it survived, as the other tests let the
// release succeed once the database came back.
func TestLostAdmissionReleaseThatGivesUpLeavesAZeroTally(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db, err := holds.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	core, logs := observer.New(zap.WarnLevel)
	h := newHarnessOn(t, harnessSetup{db: db, log: zap.New(core)}, func(c *config.Config) {
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
		c.Holds.HoldTTL = 2 * time.Second // the release retries for this long
		c.Holds.HeartbeatInterval = time.Second
	})
	u, key := h.user("standard")
	lossy.Arm("INSERT INTO run_holds (run_id, user_id, client_run_id", testenv.GoDown)
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" {
		lossy.Restore()
		t.Fatalf("admission with a lost commit reply and the database down: %d %s, want 503 billing_unavailable", resp.StatusCode, body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for logs.FilterMessageSnippet("lost admission not released; the reconciler will settle it").Len() == 0 {
		if time.Now().After(deadline) {
			lossy.Restore()
			t.Fatal("the release of the lost admission did not give up within 60s with the database down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	lossy.Restore()
	h.settled()
	if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		State   string `db:"state"`
		Held    int64  `db:"held_micro"`
		Charged int64  `db:"charged_micro"`
	}
	if err := h.db.Select(&rows, `SELECT state, held_micro, COALESCE(charged_micro, -1) AS charged_micro
		FROM run_holds WHERE user_id = ?`, u.ID); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].State != string(holds.StateSettled) || rows[0].Charged != 0 {
		t.Fatalf("holds of the caller refused 503: %+v, want one, settled at 0", rows)
	}
}
