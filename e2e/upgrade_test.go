package e2e

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// TestServeRefusesASchemaBehindIt: a new binary started before `gateway migrate` ran (or
// against a database never migrated) must not start and fail each request on a missing column:
// it exits at once naming the migrations it lacks and the command to run.
func TestServeRefusesASchemaBehindIt(t *testing.T) {
	w := newWorld(t)
	if _, err := w.db.Exec("DELETE FROM schema_migrations WHERE version = 11"); err != nil {
		t.Fatal(err)
	}
	_, err := w.tryStart("behind", w.config, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "011_api_keys_id.sql not applied") ||
		!strings.Contains(err.Error(), "gateway migrate") {
		t.Fatalf("gateway on a schema without 011: %v; want it to exit naming 011 and `gateway migrate`", err)
	}

	// A database no migration has touched.
	root := os.Getenv("TOLLGATE_TEST_MYSQL_DSN")
	admin, err := holds.Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := "tg_test_" + testenv.RandomID(6)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec("DROP DATABASE IF EXISTS " + name)
	cfg, err := mysql.ParseDSN(root)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	_, err = w.tryStart("empty", w.config, []string{"MYSQL_DSN=" + cfg.FormatDSN()}, nil)
	if err == nil || !strings.Contains(err.Error(), "001_schema.sql, ") || !strings.Contains(err.Error(), "gateway migrate") {
		t.Fatalf("gateway on an empty database: %v; want it to exit naming the migrations and `gateway migrate`", err)
	}

	// Asked to (DESIGN §1: "and on start when asked"), it applies them and serves. Its DDL waits
	// a fleet's 2 s for its locks; another package's test turning the shared server's read_only
	// on stalls every write on the server behind statements blocked on row locks, longer under
	// load (testenv.MySQLDSN's migrations wait longer for that reason): none may start meanwhile.
	testenv.NoReadOnlySpell(t, w.db)
	g, err := w.tryStart("migrated", w.config, []string{"MYSQL_DSN=" + cfg.FormatDSN()}, nil, "-migrate")
	if err != nil {
		t.Fatalf("serve -migrate on an empty database: %v", err)
	}
	migrated, err := holds.Open(context.Background(), cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer migrated.Close()
	if pending, err := tgsql.Pending(context.Background(), migrated.DB); err != nil || len(pending) > 0 {
		t.Errorf("after serve -migrate: %v pending (%v), want none", pending, err)
	}
	g.signal(t, syscall.SIGTERM)
	if err := g.wait(t, 30*time.Second); err != nil {
		t.Errorf("serve -migrate did not drain and exit: %v", err)
	}
}
