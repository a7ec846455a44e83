// Package sql holds tollgate's schema as numbered migrations embedded in the binary, so a
// deployed gateway can bring its database up to date without a checkout of the repository.
package sql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	Body    string
}

// Migrations returns the embedded migrations in order. File names are NNN_name.sql.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name is not NNN_name.sql", e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %q: %w", e.Name(), err)
		}
		body, err := fs.ReadFile(files, e.Name())
		if err != nil {
			return nil, fmt.Errorf("migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), Body: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// lockName is the named lock that serialises the migration runners of one database (named
// locks are server-wide: databases sharing a server do not wait for each other). A lock name
// is at most 64 characters, a database name too, hence the hash.
const lockName = "CONCAT('tollgate_migrate:', SHA1(DATABASE()))"

// Migrate applies the migrations the database has not seen, in order, and returns their names.
// It is safe to run twice and from two processes at once: a named lock serialises runners, and
// a migration applied again after a crash between its DDL and its version row is harmless (a
// CREATE … IF NOT EXISTS does nothing; an ALTER's "duplicate column" or "duplicate key name" is
// taken as already applied: alreadyApplied), because MySQL DDL commits implicitly and cannot be
// rolled back with the version row.
//
// Each DDL statement waits at most lockWait (DefaultLockWait; MigrateWaiting sets it) for the
// metadata lock of the table it alters, then fails saying to rerun: see DefaultLockWait.
func Migrate(ctx context.Context, db *sql.DB) ([]string, error) {
	return MigrateWaiting(ctx, db, DefaultLockWait)
}

// DefaultLockWait bounds how long a migration's DDL waits for its table's metadata lock. Every
// ALTER TABLE takes it, if only for a moment (ALGORITHM=INSTANT, or the start and end of an
// online index build), and waits behind any transaction or query still using the table — a
// usage report, a runs listing. While it waits, every later statement on that table queues
// behind it: on run_holds, every admission of every gateway, which fail at admit_timeout
// (5 s by default). MariaDB's own bound (lock_wait_timeout) is a day. Below admit_timeout,
// admissions queued behind a wait that gives up still go through.
const DefaultLockWait = 2 * time.Second

// MigrateWaiting is Migrate with each DDL statement waiting at most lockWait (whole seconds,
// at least one) for its table's metadata lock.
func MigrateWaiting(ctx context.Context, db *sql.DB, lockWait time.Duration) ([]string, error) {
	return migrateTo(ctx, db, math.MaxInt, lockWait)
}

// migrateTo is MigrateWaiting stopping after version upTo: tests build the schema an older
// binary ran against.
func migrateTo(ctx context.Context, db *sql.DB, upTo int, lockWait time.Duration) ([]string, error) {
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer conn.Close()

	// Before the lock: its name is made from DATABASE(), and with none selected GET_LOCK(NULL)
	// answers NULL at once, which read as another runner holding the lock.
	if err := requireDatabase(ctx, conn); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", 60)").Scan(&got); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("migrate: another migration holds the lock for over 60 s")
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK("+lockName+")")

	waitSeconds := max(1, int64(lockWait/time.Second))
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = "+strconv.FormatInt(waitSeconds, 10)); err != nil {
		return nil, fmt.Errorf("migrate: bound the metadata lock wait: %w", err)
	}

	// Created only when missing: CREATE TABLE IF NOT EXISTS asks for the CREATE right even when
	// the table is there, and a gateway's own user, without DDL rights, may run `serve
	// -migrate` on a schema that has nothing to apply.
	applied, err := appliedVersions(ctx, conn)
	if mysqlErrNumber(err) == errNoSuchTable {
		if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INT NOT NULL PRIMARY KEY,
		name VARCHAR(255) NOT NULL,
		applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB`); err != nil {
			return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
		}
		applied, err = map[int]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}

	var done []string
	for _, m := range migrations {
		if applied[m.Version] || m.Version > upTo {
			continue
		}
		if err := apply(ctx, conn, m, waitSeconds); err != nil {
			return done, err
		}
		done = append(done, m.Name)
	}
	return done, nil
}

// apply runs one migration's statements and records its version. A statement that finds its
// work done (a column or index a crashed run already added) counts as applied, so a run cut
// short between a statement and the record can be rerun.
func apply(ctx context.Context, conn *sql.Conn, m Migration, waitSeconds int64) error {
	for _, stmt := range splitStatements(m.Body) {
		if _, err := conn.ExecContext(ctx, stmt); err != nil && !alreadyApplied(stmt, err) {
			if mysqlErrNumber(err) == errLockWaitTimeout {
				return fmt.Errorf("migrate %s: the table it alters is in use by a long transaction or query (SHOW PROCESSLIST names it), and waiting for it longer than %d s would queue the serving gateways' statements on that table behind this one; the statement was not applied: rerun `gateway migrate` (-lock-wait to wait longer): %w",
					m.Name, waitSeconds, err)
			}
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	if _, err := conn.ExecContext(ctx, "INSERT INTO schema_migrations (version, name) VALUES (?, ?)", m.Version, m.Name); err != nil {
		return fmt.Errorf("migrate %s: record version: %w", m.Name, err)
	}
	return nil
}

// Pending returns the names of the embedded migrations the database has not recorded. A
// gateway refuses to serve on a schema behind its code: every batch would fail on a missing
// column, and callers would get 500s instead of a clear "run gateway migrate".
func Pending(ctx context.Context, db *sql.DB) ([]string, error) {
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	if err := requireDatabase(ctx, db); err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	applied, err := appliedVersions(ctx, db)
	if mysqlErrNumber(err) == errNoSuchTable {
		applied, err = nil, nil // a database never migrated: everything is pending
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range migrations {
		if !applied[m.Version] {
			out = append(out, m.Name)
		}
	}
	return out, nil
}

// appliedVersions reads the versions schema_migrations records.
func appliedVersions(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (map[int]bool, error) {
	rows, err := q.QueryContext(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema versions: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema versions: %w", err)
	}
	return applied, nil
}

// requireDatabase fails, saying why, when the connection has no database selected: a DSN
// that names none ("…/" with nothing after the slash).
func requireDatabase(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) error {
	var name sql.NullString
	if err := q.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name); err != nil {
		return fmt.Errorf("read the selected database: %w", err)
	}
	if !name.Valid || name.String == "" {
		return errors.New("no database selected: the DSN (mysql_dsn, MYSQL_DSN) names no database after its slash, e.g. user:password@tcp(host:3306)/tollgate")
	}
	return nil
}

// errLockWaitTimeout is MySQL's "Lock wait timeout exceeded", a metadata lock's included.
const errLockWaitTimeout = 1205

// errNoSuchTable is MySQL's "Table doesn't exist".
const errNoSuchTable = 1146

func mysqlErrNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// alreadyApplied recognises DDL that a crashed earlier run already executed: MySQL commits DDL
// at once, so a migration cut between a statement and its version row finds its own work on
// the rerun. Duplicate column (1060) and duplicate key name (1061) mean exactly that, and so
// does "can't drop, check that it exists" (1091) for a statement that is one index's drop
// alone (020 replaces one): a migration never drops what an earlier one did not create. An
// ALTER is atomic, so one that drops an index and does more, refused 1091 (the index dropped
// by hand, a typo), did nothing, and must not be recorded as applied.
func alreadyApplied(stmt string, err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	return me.Number == 1060 || me.Number == 1061 || me.Number == 1091 && loneIndexDrop.MatchString(stmt)
}

// loneIndexDrop is a statement that drops one index and does nothing else.
var loneIndexDrop = regexp.MustCompile("(?is)^\\s*ALTER\\s+TABLE\\s+[`\\w.]+\\s+DROP\\s+(INDEX|KEY)\\s+[`\\w]+\\s*$")

// splitStatements cuts a migration at semicolons that end a line. Migrations hold only DDL
// without semicolons inside literals, so this is enough and keeps multiStatements off the DSN.
func splitStatements(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
