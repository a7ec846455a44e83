// Package testenv gives tests a real MariaDB/MySQL database and a real Redis. It never skips:
// a test that needs a service and cannot reach it fails, loudly, because a skipped money test
// counted as passing is how races ship. `make test` starts both services and exports
// TOLLGATE_TEST_MYSQL_DSN and TOLLGATE_TEST_REDIS_URL.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fixtures"
	tgsql "github.com/tollgate/tollgate/sql"
)

// MySQLDSN creates a fresh database for this test, migrated, dropped at cleanup, and returns
// its DSN.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	root := os.Getenv("TOLLGATE_TEST_MYSQL_DSN")
	if root == "" {
		t.Fatal("TOLLGATE_TEST_MYSQL_DSN is not set: run the tests with `make test`, which starts MariaDB and Redis")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := holds.Open(ctx, root)
	if err != nil {
		t.Fatalf("connect to test MySQL: %v", err)
	}
	defer admin.Close()
	name := "tg_test_" + RandomID(6)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if db, err := holds.Open(ctx, root); err == nil {
			_, _ = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
			db.Close()
		}
	})
	cfg, err := mysql.ParseDSN(root)
	if err != nil {
		t.Fatalf("parse TOLLGATE_TEST_MYSQL_DSN: %v", err)
	}
	cfg.DBName = name
	dsn := cfg.FormatDSN()
	db, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", name, err)
	}
	defer db.Close()
	// A fresh database has no gateway whose statements could queue behind a DDL's wait, so
	// its migration waits longer than a fleet's (tgsql.DefaultLockWait, 2 s): on the shared
	// server another package's test turning read_only on waits for statements blocked on row
	// locks, and every write, this migration's too, waits behind it, seconds under load
	// (`record version: Error 1205` once in a loaded `make test`).
	if _, err := tgsql.MigrateWaiting(ctx, db.DB, migrateLockWait); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return dsn
}

// migrateLockWait bounds each of a test database's migration statements' lock waits: a
// watchdog, under MySQLDSN's minute.
const migrateLockWait = 30 * time.Second

// MySQL is MySQLDSN opened; the handle closes at cleanup.
func MySQL(t testing.TB) *sqlx.DB {
	t.Helper()
	return Open(t, MySQLDSN(t))
}

// Open opens dsn; the handle closes at cleanup.
func Open(t testing.TB, dsn string) *sqlx.DB {
	t.Helper()
	db, err := holds.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// RedisURL returns the test Redis URL.
func RedisURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TOLLGATE_TEST_REDIS_URL")
	if u == "" {
		t.Fatal("TOLLGATE_TEST_REDIS_URL is not set: run the tests with `make test`, which starts MariaDB and Redis")
	}
	return u
}

// Redis returns a client and a key prefix unique to this test, so parallel test packages
// sharing one Redis never see each other's keys. Keys under the prefix are deleted at cleanup.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("parse TOLLGATE_TEST_REDIS_URL: %v", err)
	}
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("test Redis unreachable: %v", err)
	}
	prefix := "t" + RandomID(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	})
	return rdb, prefix
}

// RandomID is n random bytes in hex.
func RandomID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// FixturesDir is the directory of recorded provider responses (see package fixtures).
func FixturesDir(t testing.TB) string {
	t.Helper()
	return fixtures.Dir(t)
}

// DSNAt is dsn with the database clock of every session standing still at at (the driver
// sends SET timestamp when it connects): how a test puts the database on either side of
// midnight, or apart from the gateway's clock.
func DSNAt(t testing.TB, dsn string, at time.Time) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["timestamp"] = fmt.Sprintf("%d.%06d", at.Unix(), at.Nanosecond()/1000)
	return cfg.FormatDSN()
}

// MySQLMidday is MySQL with the database clock of every session standing still at noon UTC of
// the day the test began (DSNAt). The day a charge lands on, and whose allowance it spends, is
// the database's UTC_DATE(): a test that settles or admits again after reading a day's figures
// would see a midnight UTC falling in between legitimately split its charges across two days'
// allowances; under this clock it cannot. NOW() does not move either: no hold of such a test
// expires by waiting.
func MySQLMidday(t testing.TB) *sqlx.DB {
	t.Helper()
	y, m, d := time.Now().UTC().Date()
	return Open(t, DSNAt(t, MySQLDSN(t), time.Date(y, m, d, 12, 0, 0, 0, time.UTC)))
}

// ConsoleTx begins a transaction on db as an operator's SQL console, or any program but the
// gateway, would hold one: with the server's default of no idle_transaction_timeout, which
// holds.Open sets on the gateway's sessions. A test that holds a lock through waits longer
// than that bound would otherwise lose it midway, and test something else. The transaction's
// connection is its own for the test's life and is discarded at its end, never pooled with
// the gateway's settings changed.
func ConsoleTx(t testing.TB, db *sqlx.DB) *sqlx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatalf("console connection: %v", err)
	}
	// MySQL has no such variable (1193, unknown): its sessions have no such bound either.
	var me *mysql.MySQLError
	if _, err := conn.ExecContext(ctx, "SET SESSION idle_transaction_timeout = 0"); err != nil && !(errors.As(err, &me) && me.Number == 1193) {
		conn.Close()
		t.Fatalf("console session: %v", err)
	}
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		conn.Close()
		t.Fatalf("console transaction: %v", err)
	}
	t.Cleanup(func() {
		_ = tx.Rollback()
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
	})
	return tx
}
