package main

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestDemoSetupWaitsOutAMigrationRunner: `gateway demo-setup` applies the missing migrations,
// as `gateway migrate` does, and so waits up to 60 s for another runner's migration lock, or
// for its own DDL on a large table. It ran them on the money paths' handle, whose replies time
// out at 30 s: behind a runner busy for longer it failed with "invalid connection" (and left
// its own statement running on the server) where `gateway migrate` waits.
func TestDemoSetupWaitsOutAMigrationRunner(t *testing.T) {
	useTestDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other, err := holds.Open(ctx, os.Getenv("MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// sql.lockName: the named lock every migration runner of this database takes.
	const lockName = "CONCAT('tollgate_migrate:', SHA1(DATABASE()))"
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the migration lock: %d, %v", got, err)
	}
	const busy = 35 * time.Second // another runner's long CREATE INDEX, past the 30 s read timeout
	var released atomic.Bool
	go func() {
		time.Sleep(busy)
		released.Store(true)
		_, _ = conn.ExecContext(ctx, "SELECT RELEASE_LOCK("+lockName+")")
	}()
	start := time.Now()
	out, err := stdout(t, func() error { return demoSetup(ctx, nil) })
	if err != nil {
		t.Fatalf("demo-setup behind a migration runner busy for %v gave up after %v: %v", busy, time.Since(start).Round(time.Second), err)
	}
	if !released.Load() {
		t.Fatalf("demo-setup returned after %v while another runner held the migration lock", time.Since(start).Round(time.Millisecond))
	}
	if len(out) == 0 {
		t.Fatal("demo-setup printed no key")
	}
}
