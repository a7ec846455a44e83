package sql_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// killedMigrateDSN, set in the environment, makes TestMigrateKilledMidStatement the process
// that is killed: it runs `gateway migrate` on that database and is SIGKILLed in its DDL.
const killedMigrateDSN = "TOLLGATE_TEST_KILLED_MIGRATE_DSN"

// TestMigrateKilledMidStatement: `gateway migrate` killed (SIGKILL, an OOM, a host lost) while
// a DDL statement runs. MariaDB goes on with the statement after its client is gone, and its
// session keeps the migration lock until it ends; the operator's rerun starts at once. The
// rerun must wait for the orphaned statement rather than race it, then find its work done and
// finish the migrations, the keys made before it intact — the README's "one killed midway is
// simply run again". The statement is held mid-way deterministically: it waits for the
// metadata lock of a console transaction reading api_keys when the process is killed.
func TestMigrateKilledMidStatement(t *testing.T) {
	ctx := context.Background()
	if dsn := os.Getenv(killedMigrateDSN); dsn != "" {
		db, err := holds.OpenForMigrate(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tgsql.MigrateWaiting(ctx, db.DB, time.Minute)
		t.Fatalf("the migration to be killed ended: %v", err)
	}
	db, dsn := emptyDBDSN(t)
	if _, err := tgsql.MigrateTo(ctx, db.DB, 10); err != nil { // 011 rebuilds api_keys
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO users (name, plan) VALUES ('u', 'standard')"); err != nil {
		t.Fatal(err)
	}
	for i := byte(1); i <= 3; i++ {
		h := make([]byte, 32)
		h[0] = i
		if _, err := db.Exec("INSERT INTO api_keys (key_hash, user_id, prefix) VALUES (?, 1, ?)", h, fmt.Sprintf("tg_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	reader := testenv.ConsoleTx(t, db)
	if _, err := reader.Exec("SELECT COUNT(*) FROM api_keys"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			_ = reader.Commit()
		}
	}
	defer release()

	child := exec.Command(os.Args[0], "-test.run=^TestMigrateKilledMidStatement$", "-test.count=1")
	child.Env = append(os.Environ(), killedMigrateDSN+"="+dsn)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	if err := waitForLockWait(db, "api_keys", exited, 30*time.Second); err != nil {
		_ = child.Process.Kill()
		t.Fatal(err)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	var orphaned int
	if err := db.Get(&orphaned, `SELECT COUNT(*) FROM information_schema.processlist
		WHERE info LIKE 'ALTER TABLE api_keys%' AND db = DATABASE()`); err != nil {
		t.Fatal(err)
	}
	t.Logf("statements of the killed migration still running on the server: %d", orphaned)

	rerun := make(chan error, 1)
	var done []string
	go func() {
		var err error
		done, err = tgsql.Migrate(ctx, db.DB)
		rerun <- err
	}()
	release()
	if err := <-rerun; err != nil {
		t.Fatalf("rerun after the migration was killed mid-statement: %v", err)
	}
	if pending, err := tgsql.Pending(ctx, db.DB); err != nil || len(pending) != 0 {
		t.Fatalf("after the rerun (applied %v): pending %v, %v", done, pending, err)
	}
	var ids []uint64
	if err := db.Select(&ids, "SELECT id FROM api_keys ORDER BY id"); err != nil || len(ids) != 3 || ids[0] == 0 || ids[1] == ids[0] || ids[2] == ids[1] {
		t.Fatalf("the keys made before the killed migration: ids %v, %v; want 3 distinct", ids, err)
	}
	fresh := emptyDB(t)
	if _, err := tgsql.Migrate(ctx, fresh.DB); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"api_keys", "run_holds", "pruned_runs"} {
		var name, got, want string
		if err := db.QueryRow("SHOW CREATE TABLE "+table).Scan(&name, &got); err != nil {
			t.Fatal(err)
		}
		if err := fresh.QueryRow("SHOW CREATE TABLE "+table).Scan(&name, &want); err != nil {
			t.Fatal(err)
		}
		autoInc := regexp.MustCompile(` AUTO_INCREMENT=\d+`)
		if autoInc.ReplaceAllString(got, "") != autoInc.ReplaceAllString(want, "") {
			t.Fatalf("%s after the killed migration and its rerun:\n%s\nwant, as migrated at once:\n%s", table, got, want)
		}
	}
}

// waitForLockWait waits until a statement ALTER TABLE table of this database waits for a
// metadata lock, and fails if the migration that sends it ends first (ended) or within passes.
func waitForLockWait(db *sqlx.DB, table string, ended <-chan error, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var n int
		if err := db.Get(&n, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE state = 'Waiting for table metadata lock' AND info LIKE CONCAT('ALTER TABLE ', ?, '%') AND db = DATABASE()`, table); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case err := <-ended:
			return fmt.Errorf("the migration ended (%v) before its ALTER of %s waited for the metadata lock", err, table)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the migration's ALTER of %s never waited for the metadata lock", table)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
