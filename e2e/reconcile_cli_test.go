package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileOnceCommand: `gateway reconcile -once` is the operator's pass. It respects the
// lock a live gateway holds, -force scans anyway, and it prints what it did.
func TestReconcileOnceCommand(t *testing.T) {
	w := newWorld(t)
	u, _ := w.user("ops", 10, nil)
	ctx := context.Background()
	for _, id := range []string{"r_cli_queued", "r_cli_lost", "r_cli_tallied"} {
		st := holds.StateRunning
		if id == "r_cli_queued" {
			st = holds.StateQueued
		}
		if _, err := w.store.Admit(ctx, holds.AdmitRequest{RunID: id, UserID: u.ID, Model: "fake-gpt", State: st, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.tally.Add(ctx, "r_cli_tallied", pricing.Usage{Input: 100, Output: 100}, 1_250, false); err != nil {
		t.Fatal(err)
	}
	if _, err := w.db.Exec("UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND"); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(gatewayBin, append([]string{"reconcile"}, args...)...)
		cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+testenv.RedisURL(t), "UPSTREAM_URL="+w.upstream.URL,
			"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gateway reconcile %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	// A live gateway holds the lock: the operator's pass stands back and says so.
	if err := w.rdb.Set(ctx, w.keys.ReconcileLock(), "gw-live", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if out := run("-once", "-config", w.config); !strings.Contains(out, "another process holds the lock") {
		t.Fatalf("pass under another's lock printed:\n%s", out)
	}
	if n := w.liveHolds(); n != 3 {
		t.Fatalf("%d live holds after a locked-out pass, want 3 untouched", n)
	}
	out := run("-once", "-force", "-config", w.config)
	t.Logf("gateway reconcile -once -force: %s", out)
	for _, want := range []string{"scanned 3", "1 settled from tally", "1 released", "1 charged at hold"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := w.liveHolds(); n != 0 {
		t.Errorf("%d holds left live", n)
	}
	// The charge in credits (credit_micro 1000), as the operator reads every other figure.
	var charged int64
	for _, id := range []string{"r_cli_tallied", "r_cli_queued", "r_cli_lost"} {
		charged += w.hold(id).ChargedMicro
	}
	if want := "charged " + pricing.FormatCredits(charged, 1000) + " credits"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	if r := w.hold("r_cli_tallied"); r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != 1_250 {
		t.Errorf("tallied run: %q %d", r.SettleSource.String, r.ChargedMicro)
	}
}
