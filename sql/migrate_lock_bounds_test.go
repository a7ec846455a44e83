package sql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// TestMigrateLockWaitIsTheWholeSecondsAsked: MigrateWaiting bounds each DDL statement's
// metadata lock wait by the session's lock_wait_timeout, in whole seconds and at least one.
// A second more than asked queues a serving fleet's admissions behind the wait a second longer
// (DefaultLockWait is chosen below admit_timeout); 0 makes the server give up at once (NOWAIT)
// on any table a reader touches, so an upgrade fails on every brief report. The runner's
// connection is the pool's only one, so the setting it ran with can be read back after.
func TestMigrateLockWaitIsTheWholeSecondsAsked(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t) // migrated: nothing to apply, the bound is set all the same
	db.SetMaxOpenConns(1)
	for _, c := range []struct {
		wait time.Duration
		want int64
	}{
		{tgsql.DefaultLockWait, int64(tgsql.DefaultLockWait / time.Second)},
		{1 * time.Second, 1},
		{5 * time.Second, 5},
		{1500 * time.Millisecond, 1},
		{0, 1},
		{300 * time.Millisecond, 1},
	} {
		if _, err := tgsql.MigrateWaiting(ctx, db.DB, c.wait); err != nil {
			t.Fatalf("migrate waiting %v: %v", c.wait, err)
		}
		var got int64
		if err := db.GetContext(ctx, &got, "SELECT @@SESSION.lock_wait_timeout"); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("migrate waiting %v ran with lock_wait_timeout %d s, want %d s (whole seconds, at least one)", c.wait, got, c.want)
		}
	}
}

// TestMigrateRefusesWhileAnotherRunnerKeepsTheLock: a runner that waited its 60 s for the
// migration lock and did not get it (GET_LOCK answers 0) must stop, applying nothing: the
// holder may be midway through the very migration it would apply, and DDL run twice at once
// fails half-applied or records a version twice. Takes the 60 s the lock wait is bounded by.
func TestMigrateRefusesWhileAnotherRunnerKeepsTheLock(t *testing.T) {
	ctx := context.Background()
	db, dsn := emptyDBDSN(t)
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	last := all[len(all)-1]
	if _, err := tgsql.MigrateTo(ctx, db.DB, last.Version-1); err != nil {
		t.Fatal(err)
	}

	takeMigrationLock(t, ctx, dsn)

	done, err := tgsql.Migrate(ctx, db.DB)
	if err == nil || !strings.Contains(err.Error(), "another migration holds the lock") {
		t.Fatalf("migrate while another runner keeps the lock: applied %v, err %v; want it refused for the lock", done, err)
	}
	if len(done) != 0 {
		t.Fatalf("migrate without the lock applied %v", done)
	}
	var recorded int
	if err := db.GetContext(ctx, &recorded, "SELECT COUNT(*) FROM schema_migrations WHERE version = ?", last.Version); err != nil || recorded != 0 {
		t.Fatalf("%s recorded %d times (%v) by a runner that never had the lock, want 0", last.Name, recorded, err)
	}
}
