package sql_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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
	other, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+tgsql.LockName+", 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the migration lock: %d, %v", got, err)
	}
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
