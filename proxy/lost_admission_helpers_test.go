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

// newObservedLossyHarness is newLossyHarness (one-second admit and settle timeouts, the
// database behind a lossy network) with the gateway's warnings observed and tweak applied.
func newObservedLossyHarness(t *testing.T, tweak func(*config.Config)) (*harness, *testenv.Lossy, *observer.ObservedLogs) {
	t.Helper()
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	core, logs := observer.New(zap.WarnLevel)
	h := newHarnessOn(t, harnessSetup{db: db, log: zap.New(core)}, func(c *config.Config) {
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
		if tweak != nil {
			tweak(c)
		}
	})
	return h, lossy, logs
}

// armCommitLost makes the next admission's script reach the database, commit, and lose its
// reply with the network, which stays down until lossy.Restore: the gateway cannot know
// whether the hold exists.
func armCommitLost(lossy *testenv.Lossy) {
	lossy.Arm("INSERT INTO run_holds (run_id, user_id, client_run_id", testenv.GoDown)
}

// postRefusedWithCommitLost sends a call whose admission commits with its reply lost and the
// database then out of reach: the caller must be refused 503 billing_unavailable.
func postRefusedWithCommitLost(t *testing.T, h *harness, lossy *testenv.Lossy, key string, hdr map[string]string) {
	t.Helper()
	armCommitLost(lossy)
	resp := h.post(key, "/v1/chat/completions", chatBody, hdr)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "billing_unavailable" {
		lossy.Restore()
		t.Fatalf("admission with a lost commit reply and the database down: %d %s, want 503 billing_unavailable", resp.StatusCode, body)
	}
}

// awaitLog waits, up to within, for a line containing snippet; past it the network is
// restored (so the gateway's background work can end) and the test fails.
func awaitLog(t *testing.T, logs *observer.ObservedLogs, lossy *testenv.Lossy, snippet string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for logs.FilterMessageSnippet(snippet).Len() == 0 {
		if time.Now().After(deadline) {
			lossy.Restore()
			t.Fatalf("no %q logged within %v", snippet, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reconcileAndWantUnchargedHold expires the user's one hold and runs the reconciler, finding
// no lease, over it: the caller refused 503 must end with its hold settled at 0, by whichever
// of the release and the reconciler got there.
func reconcileAndWantUnchargedHold(t *testing.T, h *harness, userID uint64) {
	t.Helper()
	if _, err := h.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE user_id = ?", userID); err != nil {
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
		COALESCE(settle_source, '') AS settle_source FROM run_holds WHERE user_id = ?`, userID); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].State != string(holds.StateSettled) || rows[0].Charged != 0 {
		t.Fatalf("holds of the caller refused 503: %+v, want one, settled at 0", rows)
	}
	t.Logf("refused call's hold %s: settled by %s at %d (held %d)", rows[0].RunID, rows[0].Source, rows[0].Charged, rows[0].Held)
}
