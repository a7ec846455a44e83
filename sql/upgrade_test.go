package sql_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// emptyDB creates a database that no migration has touched (testenv's are migrated), dropped
// at cleanup, and returns it opened as `gateway migrate` opens it.
func emptyDB(t *testing.T) *sqlx.DB {
	db, _ := emptyDBDSN(t)
	return db
}

// emptyDBDSN is emptyDB with the database's DSN.
func emptyDBDSN(t *testing.T) (*sqlx.DB, string) {
	t.Helper()
	root := os.Getenv("TOLLGATE_TEST_MYSQL_DSN")
	if root == "" {
		t.Fatal("TOLLGATE_TEST_MYSQL_DSN is not set: run the tests with `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := holds.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := "tg_test_" + testenv.RandomID(6)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if db, err := holds.Open(context.Background(), root); err == nil {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + name)
			db.Close()
		}
	})
	cfg, err := mysql.ParseDSN(root)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	db, err := holds.OpenForMigrate(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, cfg.FormatDSN()
}

// TestEveryMigrationRerunsAfterACrash: MySQL commits DDL at once, so a `gateway migrate` killed
// between a migration's statements and its version row finds its own work on the rerun. Every
// migration must then apply again cleanly: all of its statements already done, and, for a
// migration of several statements, only the first ones done.
func TestEveryMigrationRerunsAfterACrash(t *testing.T) {
	ctx := context.Background()
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	db := emptyDB(t)
	for _, m := range all {
		if _, err := tgsql.MigrateTo(ctx, db.DB, m.Version); err != nil {
			t.Fatalf("apply %s: %v", m.Name, err)
		}
		// Killed after the DDL, before the version row.
		if _, err := db.Exec("DELETE FROM schema_migrations WHERE version = ?", m.Version); err != nil {
			t.Fatal(err)
		}
		done, err := tgsql.MigrateTo(ctx, db.DB, m.Version)
		if err != nil || len(done) != 1 || done[0] != m.Name {
			t.Fatalf("rerun of %s after a crash before its version row: applied %v, %v", m.Name, done, err)
		}
	}
	for _, m := range all {
		stmts := tgsql.SplitStatements(m.Body)
		for k := 1; k < len(stmts); k++ {
			t.Run(fmt.Sprintf("%s_after_%d_of_%d", m.Name, k, len(stmts)), func(t *testing.T) {
				db := emptyDB(t)
				if _, err := tgsql.MigrateTo(ctx, db.DB, m.Version-1); err != nil {
					t.Fatal(err)
				}
				for _, s := range stmts[:k] {
					if _, err := db.Exec(s); err != nil {
						t.Fatalf("statement %q: %v", s, err)
					}
				}
				if done, err := tgsql.Migrate(ctx, db.DB); err != nil || len(done) != len(all)-m.Version+1 {
					t.Fatalf("rerun cut after statement %d: applied %v, %v", k, done, err)
				}
			})
		}
	}
}

// TestOldKeyStatementsOnSchema011: migration 011 gives api_keys an AUTO_INCREMENT id while the
// binaries of before it still serve. Their statements (holds/accounts.go and holds/admin.go as
// of b7ae5d7^: explicit column lists everywhere) must work against the new schema, and a key
// they create must get an id the new listing pages by.
func TestOldKeyStatementsOnSchema011(t *testing.T) {
	ctx := context.Background()
	db := emptyDB(t)
	if _, err := tgsql.MigrateTo(ctx, db.DB, 10); err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec("INSERT INTO users (name, plan) VALUES (?, ?)", "old", "standard")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := res.LastInsertId()
	hash := func(b byte) []byte { h := make([]byte, 32); h[0] = b; return h }
	// A key made before the migration.
	if _, err := db.Exec("INSERT INTO api_keys (key_hash, user_id, prefix) VALUES (?, ?, ?)", hash(1), uid, "tg_before"); err != nil {
		t.Fatal(err)
	}
	if done, err := tgsql.MigrateTo(ctx, db.DB, 11); err != nil || len(done) != 1 {
		t.Fatalf("migrate to 011: %v, %v", done, err)
	}
	// The old binary, now on the new schema.
	old := []struct {
		q    string
		args []any
	}{
		{"INSERT INTO api_keys (key_hash, user_id, prefix) VALUES (?, ?, ?)", []any{hash(2), uid, "tg_after"}},
		{"UPDATE api_keys SET revoked_at = NOW(6) WHERE key_hash = ? AND revoked_at IS NULL", []any{hash(2)}},
		{"SELECT prefix, created_at, revoked_at FROM api_keys WHERE user_id = ? ORDER BY created_at DESC, prefix LIMIT ?", []any{uid, 10}},
		{"SELECT user_id FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", []any{hash(1)}},
		{"SELECT COUNT(*) FROM api_keys WHERE key_hash = ? AND revoked_at IS NOT NULL", []any{hash(2)}},
		{"SELECT key_hash FROM api_keys WHERE user_id = ? AND prefix = ? AND revoked_at IS NULL", []any{uid, "tg_before"}},
		{`SELECT k.key_hash, u.id, u.name, u.plan FROM api_keys k JOIN users u ON u.id = k.user_id
			WHERE k.key_hash IN (?) AND k.revoked_at IS NULL AND u.disabled_at IS NULL`, []any{hash(1)}},
	}
	for _, s := range old {
		rows, err := db.Query(s.q, s.args...)
		if err != nil {
			t.Fatalf("old statement %q on schema 011: %v", s.q, err)
		}
		rows.Close()
	}
	var ids []uint64
	if err := db.Select(&ids, "SELECT id FROM api_keys ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] == 0 || ids[0] == ids[1] {
		t.Fatalf("key ids %v: want two distinct ids, the pre-migration key's included", ids)
	}
	keys, err := holds.NewStore(db, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop()).ListKeys(ctx, uint64(uid), 0, 10)
	if err != nil || len(keys) != 2 {
		t.Fatalf("new listing of the old binary's keys: %v, %v", keys, err)
	}
}

// TestMigrateDoesNotQueueAdmissionsBehindItsLockWait: an ALTER TABLE needs the table's
// metadata lock, if only for a moment (ALGORITHM=INSTANT, or the start and end of an online
// index build), and waits for it behind any transaction or long query using the table (a usage
// report, a runs listing). While it waits, every later statement on the table queues behind
// it: on run_holds that is every admission, which failed at admit_timeout (503) for as long as
// the report ran — by default MariaDB waits a day. Migrate must give up its wait early, saying
// to rerun, so that the serving gateways go on.
func TestMigrateDoesNotQueueAdmissionsBehindItsLockWait(t *testing.T) {
	ctx := context.Background()
	db, dsn := emptyDBDSN(t)
	if _, err := tgsql.MigrateTo(ctx, db.DB, 9); err != nil { // 010 alters run_holds
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO users (name, plan) VALUES ('u', 'standard')"); err != nil {
		t.Fatal(err)
	}
	money, err := holds.Open(ctx, dsn) // as the gateways open it
	if err != nil {
		t.Fatal(err)
	}
	defer money.Close()

	// A long reader of run_holds: a transaction open across a report.
	reader, err := money.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := reader.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.ExecContext(ctx, "SELECT COUNT(*) FROM run_holds"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			_, _ = reader.ExecContext(ctx, "COMMIT")
		}
	}
	defer release()

	migrated := make(chan error, 1)
	go func() { _, err := tgsql.Migrate(ctx, db.DB); migrated <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := money.Get(&n, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE state LIKE 'Waiting for table metadata lock' AND info LIKE 'ALTER TABLE run_holds%'`); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		select {
		case err := <-migrated:
			t.Fatalf("migrate ended (%v) without waiting for the reader's metadata lock", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("migrate never waited for the metadata lock")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// An admission while the ALTER waits, bounded like the gateway's (admit_timeout, 5 s).
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err = money.ExecContext(actx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at)
		VALUES ('r1', 1, 'queued', 1, 1, NOW(6) + INTERVAL 1 MINUTE)`)
	took := time.Since(start)
	release()
	merr := <-migrated
	if err != nil {
		t.Fatalf("an admission queued behind the migration's lock wait failed after %v: %v", took.Round(time.Millisecond), err)
	}
	if merr == nil || !strings.Contains(merr.Error(), "rerun") {
		t.Fatalf("migrate behind a long reader: %v; want it to give up its wait and say to rerun", merr)
	}
	if done, err := tgsql.Migrate(ctx, db.DB); err != nil || len(done) == 0 || done[0] != "010_run_holds_created_index.sql" {
		t.Fatalf("rerun once the reader is gone: %v, %v; want 010 applied first", done, err)
	}
}

// TestHotTablesAreAlteredOnline: run_holds, users and usage_days are written by every
// admission and settlement of every serving gateway. A migration that copies one of them
// (LOCK=SHARED or EXCLUSIVE: a column's type changed, an AUTO_INCREMENT column added) blocks
// those writes for as long as the copy takes, that is every call of the fleet. Each statement
// of every migration that touches them must be possible with LOCK=NONE (instant, or an online
// rebuild or index build); one that is not has to say so to the operator and is caught here.
func TestHotTablesAreAlteredOnline(t *testing.T) {
	ctx := context.Background()
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	hot := regexp.MustCompile(`(?is)^\s*(ALTER\s+TABLE\s+(run_holds|users|usage_days)\b|CREATE\s+(UNIQUE\s+)?INDEX\s+\w+\s+ON\s+(run_holds|users|usage_days)\b)`)
	db := emptyDB(t)
	checked := 0
	for _, m := range all {
		if m.Version == 1 {
			if _, err := tgsql.MigrateTo(ctx, db.DB, 1); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, stmt := range tgsql.SplitStatements(m.Body) {
			if !hot.MatchString(stmt) {
				continue
			}
			online := stmt + ", LOCK=NONE"
			if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(stmt)), "CREATE") {
				online = stmt + " LOCK=NONE"
			}
			if _, err := db.Exec(online); err != nil {
				t.Errorf("%s: %q cannot run with LOCK=NONE: it blocks the fleet's writes for its duration: %v", m.Name, stmt, err)
			}
			checked++
		}
		if _, err := tgsql.MigrateTo(ctx, db.DB, m.Version); err != nil {
			t.Fatalf("apply %s: %v", m.Name, err)
		}
	}
	if checked == 0 {
		t.Fatal("no statement on a hot table found: the pattern is wrong")
	}
}
