package sql_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"

	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// TestMigrateTwiceIsANoOp: testenv already migrated the database; running again applies
// nothing and fails on nothing, so `gateway migrate` is safe in every deploy script.
func TestMigrateTwiceIsANoOp(t *testing.T) {
	db := testenv.MySQL(t)
	for i := 0; i < 2; i++ {
		done, err := tgsql.Migrate(context.Background(), db.DB)
		if err != nil {
			t.Fatalf("migrate run %d: %v", i+2, err)
		}
		if len(done) != 0 {
			t.Fatalf("migrate run %d applied %v again", i+2, done)
		}
	}
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var applied int
	if err := db.Get(&applied, "SELECT COUNT(*) FROM schema_migrations"); err != nil {
		t.Fatal(err)
	}
	if applied != len(all) {
		t.Fatalf("%d migrations recorded, %d embedded", applied, len(all))
	}
}

func TestMigrationsAreNumberedAndUnique(t *testing.T) {
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range all {
		if m.Version != i+1 {
			t.Fatalf("migration %s has version %d, want %d (no gaps)", m.Name, m.Version, i+1)
		}
	}
}

// TestPendingNamesWhatIsNotApplied: a migrated database has nothing pending; one whose last
// migration was not applied names it, so that serve refuses to start on it.
func TestPendingNamesWhatIsNotApplied(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := context.Background()
	if p, err := tgsql.Pending(ctx, db.DB); err != nil || len(p) != 0 {
		t.Fatalf("pending on a migrated database: %v, %v", p, err)
	}
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := all[len(all)-1]
	if _, err := db.Exec("DELETE FROM schema_migrations WHERE version = ?", last.Version); err != nil {
		t.Fatal(err)
	}
	if p, err := tgsql.Pending(ctx, db.DB); err != nil || len(p) != 1 || p[0] != last.Name {
		t.Fatalf("pending with %s unrecorded: %v, %v", last.Name, p, err)
	}
	if _, err := db.Exec("DROP TABLE schema_migrations"); err != nil {
		t.Fatal(err)
	}
	if p, err := tgsql.Pending(ctx, db.DB); err != nil || len(p) != len(all) {
		t.Fatalf("pending on a database never migrated: %v, %v", p, err)
	}
}

// TestMigrateWaitsOutAnotherRunner: `gateway migrate` is safe from two processes because a
// named lock serialises them; the second waits up to 60 s for the first, whose DDL on a large
// table may take that long. It must not give up earlier on a client-side read timeout.
func TestMigrateWaitsOutAnotherRunner(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	ctx := context.Background()
	conn := takeMigrationLock(t, ctx, dsn)
	const busy = 35 * time.Second // the first runner's long CREATE INDEX, say
	// Set before the lock is released, so a second runner that waited for the lock always
	// sees it; one that did not wait returns while it is still false.
	var released atomic.Bool
	go func() {
		time.Sleep(busy) // the scenario: the first runner's DDL outlasting the read timeout
		released.Store(true)
		_, _ = conn.ExecContext(ctx, "SELECT RELEASE_LOCK("+tgsql.LockName+")")
	}()
	db, err := holds.OpenForMigrate(ctx, dsn) // as `gateway migrate` opens it
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := time.Now()
	if _, err := tgsql.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate behind a runner busy for %v gave up after %v: %v", busy, time.Since(start).Round(time.Second), err)
	}
	if !released.Load() {
		t.Fatalf("migrate returned after %v while the other runner still held the lock: it did not wait for it",
			time.Since(start).Round(time.Millisecond))
	}
}

// TestMigrateWithoutDDLRights: a gateway's own database user often has no right to change
// the schema (SELECT, INSERT, UPDATE, DELETE only), and `serve -migrate` or a deploy script's
// `gateway migrate` runs with it. On a schema with nothing to apply that needs no DDL, and must
// succeed; Migrate created schema_migrations (IF NOT EXISTS, which still asks for the CREATE
// right) every time, so every start failed on "CREATE command denied … schema_migrations".
// On a schema behind, the refusal must name the migration that needs the right, not the
// bookkeeping table.
func TestMigrateWithoutDDLRights(t *testing.T) {
	ctx := context.Background()
	db, dsn := emptyDBDSN(t)
	// Its account has no SUPER: another package's read_only spell would refuse its DDL with
	// read_only's error, not the missing right's.
	testenv.NoReadOnlySpell(t, db)
	if _, err := tgsql.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	user := "tg_dml_" + testenv.RandomID(4)
	if _, err := db.Exec("CREATE USER '" + user + "'@'%' IDENTIFIED BY 'dml'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	if _, err := db.Exec("GRANT SELECT, INSERT, UPDATE, DELETE ON `" + cfg.DBName + "`.* TO '" + user + "'@'%'"); err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, "dml"
	dml, err := holds.OpenForMigrate(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer dml.Close()

	if done, err := tgsql.Migrate(ctx, dml.DB); err != nil || len(done) != 0 {
		t.Fatalf("migrate an up-to-date schema without DDL rights: applied %v, %v; want nothing to do and no error", done, err)
	}

	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	// Unrecorded: the server checks the right before it looks at what the DDL would change.
	last := all[len(all)-1]
	if _, err := db.Exec("DELETE FROM schema_migrations WHERE version = ?", last.Version); err != nil {
		t.Fatal(err)
	}
	_, err = tgsql.Migrate(ctx, dml.DB)
	if err == nil || !strings.Contains(err.Error(), last.Name) {
		t.Fatalf("migrate a schema behind without DDL rights: %v; want the refusal to name %s", err, last.Name)
	}
}

// TestMigrateRunnersRacing: `gateway migrate` from several processes at once (a deploy script
// on every host, or every gateway started with `serve -migrate`) on a database no migration has
// touched, so that even schema_migrations is created inside the race. Each runner has its own
// pool, as separate processes do. Every one must succeed, and every migration be applied by
// exactly one of them and recorded once.
func TestMigrateRunnersRacing(t *testing.T) {
	ctx := context.Background()
	_, dsn := emptyDBDSN(t)
	const runners = 3
	pools := make([]*sqlx.DB, runners)
	for i := range pools {
		db, err := holds.OpenForMigrate(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		pools[i] = db
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	done := make([][]string, runners)
	errs := make([]error, runners)
	for i := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			done[i], errs[i] = tgsql.Migrate(ctx, pools[i].DB)
		}()
	}
	close(start)
	wg.Wait()
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i := range done {
		if errs[i] != nil {
			t.Fatalf("runner %d of %d at once: %v", i, runners, errs[i])
		}
		for _, n := range done[i] {
			seen[n]++
		}
	}
	for _, m := range all {
		if seen[m.Name] != 1 {
			t.Errorf("%s applied by %d runners, want exactly 1 (applied: %v)", m.Name, seen[m.Name], done)
		}
	}
	var recorded int
	if err := pools[0].Get(&recorded, "SELECT COUNT(*) FROM schema_migrations"); err != nil || recorded != len(all) {
		t.Fatalf("%d migrations recorded (%v), %d embedded", recorded, err, len(all))
	}
}

// takeMigrationLock takes the migration lock as another runner would, on a connection of its
// own that the test's end closes (which releases the lock, if the test has not).
func takeMigrationLock(t *testing.T, ctx context.Context, dsn string) *sql.Conn {
	t.Helper()
	other, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+tgsql.LockName+", 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the migration lock: %d, %v", got, err)
	}
	return conn
}
