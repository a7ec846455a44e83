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

	// A long reader of run_holds: an operator's transaction open across a report.
	reader := testenv.ConsoleTx(t, money)
	if _, err := reader.ExecContext(ctx, "SELECT COUNT(*) FROM run_holds"); err != nil {
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

	migrated := make(chan error, 1)
	go func() { _, err := tgsql.Migrate(ctx, db.DB); migrated <- err }()
	if err := waitForLockWait(money, "run_holds", migrated, 10*time.Second); err != nil {
		t.Fatal(err)
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

// TestOldRunStatementsOnSchema014: migration 014 adds the one-hour cache write and audio parts
// of the token totals to run_holds and pruned_runs while gateways of before it still serve
// (and an operator may run their `gateway prune`). Their statements that write and read a
// run's usage (holds/runs.go, settle.go, prune.go and admin.go as of the commit before 014,
// explicit column lists everywhere) must work against the new schema, and what they write
// reads as parts of 0 in the new run view and report.
func TestOldRunStatementsOnSchema014(t *testing.T) {
	ctx := context.Background()
	db := emptyDB(t)
	if _, err := tgsql.MigrateTo(ctx, db.DB, 14); err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec("INSERT INTO users (name, plan) VALUES (?, ?)", "old", "standard")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := res.LastInsertId()
	old := []struct {
		q    string
		args []any
	}{
		// Admissions: a one-call run and a named one.
		{`INSERT INTO run_holds (run_id, user_id, client_run_id, session_id, state, held_micro, cap_micro, model, discount_bp,
			expires_at, admit_token, price_snapshot) VALUES (?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?),
			(?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?)`,
			[]any{"r_old_one", uid, "", "", "running", 1000, 1000, "m", 0, time.Now().Add(time.Hour), "tok1", nil,
				"r_old_named", uid, "task", "", "running", 1000, 1000, "m", 0, time.Now().Add(time.Hour), "tok2", nil}},
		// A named run's call recorded on its row.
		{`UPDATE run_holds SET expires_at = GREATEST(expires_at, NOW(6) + INTERVAL ? MICROSECOND),
			in_tok = in_tok + ?, cache_read_tok = cache_read_tok + ?, cache_write_tok = cache_write_tok + ?, out_tok = out_tok + ?,
			cost_micro = cost_micro + ?, calls = calls + ?, ended_calls = ended_calls + 1, estimated = GREATEST(estimated, ?)
			WHERE run_id = ? AND state IN ('queued', 'running')`, []any{int64(3_600_000_000), 10, 0, 0, 5, 100, 1, false, "r_old_named"}},
		// The settlement batch's mark of the settled holds.
		{`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, discount_bp, expires_at,
			cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok,
			out_tok, calls, model, price_snapshot, estimated, settle_source, settled_at, settle_token) VALUES
			(?,?,'settled',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?), (?,?,'settled',?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
			ON DUPLICATE KEY UPDATE state = VALUES(state), cost_micro = VALUES(cost_micro),
			charged_micro = VALUES(charged_micro), allowance_part_micro = VALUES(allowance_part_micro),
			prepaid_part_micro = VALUES(prepaid_part_micro), in_tok = VALUES(in_tok), cache_read_tok = VALUES(cache_read_tok),
			cache_write_tok = VALUES(cache_write_tok), out_tok = VALUES(out_tok), calls = VALUES(calls),
			model = IF(VALUES(model) = '', model, VALUES(model)), price_snapshot = COALESCE(VALUES(price_snapshot), price_snapshot),
			estimated = GREATEST(estimated, VALUES(estimated)), settle_source = VALUES(settle_source), settled_at = VALUES(settled_at),
			settle_token = VALUES(settle_token)`,
			[]any{"r_old_one", uid, 1000, 1000, 0, time.Now(), 200, 200, 200, 0, 20, 0, 0, 10, 1, "m", nil, false, "complete", time.Now(), "s1",
				"r_old_named", uid, 1000, 1000, 0, time.Now(), 100, 100, 100, 0, 10, 0, 0, 5, 1, "m", nil, false, "client", time.Now(), "s2"}},
		{`INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES (?, UTC_DATE(), 300, 2)`, []any{uid}},
		// The runs listing and a run's read.
		{`SELECT run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro, charged_micro,
			allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok, calls, ended_calls, model,
			discount_bp, estimated, settle_source, expires_at, created_at, settled_at FROM run_holds WHERE user_id = ?`, []any{uid}},
		// The usage report's read of pruned sums, and a prune's write of them.
		{`SELECT h.user_id, DATE_FORMAT(h.day, '%Y-%m-%d'), h.model, h.runs, h.charged_runs, h.estimated_runs, h.calls, h.in_tok,
			h.cache_read_tok, h.cache_write_tok, h.out_tok, h.cost_micro, h.charged_micro,
			h.allowance_part_micro, h.prepaid_part_micro FROM pruned_runs h WHERE h.user_id = ?`, []any{uid}},
		{`INSERT INTO pruned_runs (user_id, day, model, runs, charged_runs, estimated_runs, calls, in_tok, cache_read_tok,
			cache_write_tok, out_tok, cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro)
			VALUES (?, UTC_DATE() - INTERVAL 30 DAY, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON DUPLICATE KEY UPDATE runs = runs + VALUES(runs), charged_runs = charged_runs + VALUES(charged_runs),
			estimated_runs = estimated_runs + VALUES(estimated_runs),
			calls = calls + VALUES(calls), in_tok = in_tok + VALUES(in_tok), cache_read_tok = cache_read_tok + VALUES(cache_read_tok),
			cache_write_tok = cache_write_tok + VALUES(cache_write_tok), out_tok = out_tok + VALUES(out_tok),
			cost_micro = cost_micro + VALUES(cost_micro), charged_micro = charged_micro + VALUES(charged_micro),
			allowance_part_micro = allowance_part_micro + VALUES(allowance_part_micro),
			prepaid_part_micro = prepaid_part_micro + VALUES(prepaid_part_micro)`,
			[]any{uid, "m", 1, 0, 0, 1, 7, 0, 0, 3, 0, 0, 0, 0}},
	}
	for _, s := range old {
		rows, err := db.Query(s.q, s.args...)
		if err != nil {
			t.Fatalf("old statement %q on schema 014: %v", s.q, err)
		}
		rows.Close()
	}
	store := holds.NewStore(db, map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop())
	for _, id := range []string{"r_old_one", "r_old_named"} {
		r, err := store.Run(ctx, uint64(uid), id)
		if err != nil || r.State != holds.StateSettled || r.InTok == 0 || r.CacheWrite1hTok != 0 || r.AudioInTok != 0 || r.AudioOutTok != 0 {
			t.Fatalf("old gateway's run %s read by the new one: %+v, %v; want settled, its parts 0", id, r, err)
		}
	}
	today, err := store.Today(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := store.Usage(ctx, today.AddDate(0, 0, -30), today, uint64(uid))
	if err != nil || rep.Totals.Runs != 3 || rep.Totals.InTok != 37 || rep.Totals.AudioInTok != 0 || rep.Totals.CacheWrite1hTok != 0 {
		t.Fatalf("new report over the old gateway's runs and pruned sums: %+v, %v; want 3 runs, 37 input tokens, parts 0", rep, err)
	}
}
