package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/holds"
)

// TestBackupRestoreRunbook walks README's "Backups and restores" with its own commands: a
// mariadb-dump taken while a call streams, more calls and a grant after it, every gateway
// stopped, the dump restored into a dropped database, the processes it caught serving
// retired, `gateway reconcile -once -force`, `gateway audit`. The call the backup caught in
// flight is charged once, at its usage, from its Redis tally, before any gateway starts; what
// the database learned after the backup (a call, a grant) is gone, and the grant sent again
// under its key is paid once.
func TestBackupRestoreRunbook(t *testing.T) {
	w := newWorld(t)
	// Holds that outlive the test: only the runbook's steps may settle the one caught in flight.
	w.config = w.writeConfig(map[string]string{"holds.hold_ttl": "10m", "holds.run_ttl": "10m"})
	u, key := w.user("restored", 10, nil)
	g := w.startGateway("gw-before")
	completeCall(t, g, key, chatBody(false, 20, "before the backup"), nil)

	hdr, letGo := w.holdStreams("at-backup", nil)
	s := startStream(t, g, key, 5, time.Millisecond, hdr)
	dump := filepath.Join(t.TempDir(), "tollgate.sql")
	db := dbToolsFor(t, w.dsn)
	db.shell(t, "", "mariadb-dump", "--single-transaction", "--hex-blob", "--routines", "--triggers", "--databases", db.name, "-r", dump)
	letGo()
	<-s.done
	waitFor(t, 10*time.Second, "the stream's own settlement", func() bool { return w.hold(s.runID).State == holds.StateSettled })
	streamed := w.hold(s.runID)
	after, _ := completeCall(t, g, key, chatBody(false, 20, "after the backup"), nil)
	w.runbookCmd(t, "grant", "-config", w.config, "-user", u.Name, "-amount", "5", "-key", "grant-after-backup")

	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 30*time.Second); err != nil {
		t.Fatalf("gateway did not stop: %v", err)
	}
	db.shell(t, "", "mariadb", "-e", "DROP DATABASE "+db.name)
	db.shell(t, dump, "mariadb")
	if r := w.hold(s.runID); r.State != holds.StateRunning {
		t.Fatalf("the backup holds the stream's run %s, want it running as it was at the dump", r.State)
	}
	// Without the runbook's UPDATE the restored row of the stopped gateway looks alive, and the
	// operator's pass, which declares no process dead, leaves its hold for hold_ttl.
	w.runbookCmd(t, "reconcile", "-once", "-force", "-config", w.config)
	if r := w.hold(s.runID); r.State != holds.StateRunning {
		t.Fatalf("a pass before the UPDATE settled the stream's run (%s): the runbook's step is not needed", r.State)
	}
	db.shell(t, "", "mariadb", db.name, "-e", "UPDATE instances SET dead_at = NOW(6), retired = 1 WHERE dead_at IS NULL")
	out := w.runbookCmd(t, "reconcile", "-once", "-force", "-config", w.config)
	if !strings.Contains(out, "1 settled from tally") {
		t.Errorf("reconcile after the restore printed:\n%s", out)
	}
	r := w.hold(s.runID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != streamed.ChargedMicro {
		t.Fatalf("the call caught in flight: %s %q charged %d, want settled from its tally at %d, what its gateway charged it",
			r.State, r.SettleSource.String, r.ChargedMicro, streamed.ChargedMicro)
	}
	var lost int
	if err := w.db.Get(&lost, "SELECT COUNT(*) FROM run_holds WHERE run_id = ?", after); err != nil || lost != 0 {
		t.Fatalf("the call after the backup: %d rows (%v), want none: the restore forgets it", lost, err)
	}
	w.runbookCmd(t, "audit")

	// The grant made after the backup, sent again under its key, is paid once.
	before, err := w.store.Balance(context.Background(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		w.runbookCmd(t, "grant", "-config", w.config, "-user", u.Name, "-amount", "5", "-key", "grant-after-backup")
	}
	got, err := w.store.Balance(context.Background(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.PrepaidMicro-before.PrepaidMicro != 5_000 {
		t.Fatalf("prepaid rose by %d µUSD over the grant sent twice, want 5000 once", got.PrepaidMicro-before.PrepaidMicro)
	}
	// The gateways start again and serve.
	completeCall(t, w.startGateway("gw-after"), key, chatBody(false, 20, "after the restore"), nil)
}

// dbTools is the world's database as the mariadb command-line tools reach it.
type dbTools struct {
	name string
	args []string // host, port, user and password
}

func dbToolsFor(t *testing.T, dsn string) dbTools {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port, ok := strings.Cut(cfg.Addr, ":")
	if cfg.Net != "tcp" || !ok {
		t.Fatalf("test DSN is not host:port over tcp: %s %s", cfg.Net, cfg.Addr)
	}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("test DSN port %q: %v", port, err)
	}
	args := []string{"-h", host, "-P", port, "-u", cfg.User}
	if cfg.Passwd != "" {
		args = append(args, "-p"+cfg.Passwd) // -p alone would ask for one
	}
	return dbTools{name: cfg.DBName, args: args}
}

// shell runs a mariadb client tool (stdin from the file in, if any), which must succeed.
func (d dbTools) shell(t *testing.T, in, tool string, args ...string) {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		t.Fatalf("the runbook's %s is not installed (Debian's mariadb-client has it): %v", tool, err)
	}
	cmd := exec.Command(path, append(append([]string{}, d.args...), args...)...)
	if in != "" {
		f, err := os.Open(in)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdin = f
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
	}
}

// runbookCmd is gatewayCmd on the world's database, which must succeed.
func (w *world) runbookCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := gatewayCmd(w, w.dsn, args...)
	if err != nil {
		t.Fatalf("gateway %v: %v\n%s", args, err, out)
	}
	return out
}
