package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// readOnlyLock names the server-wide lock a test holds while it may turn the shared server's
// global read_only on.
const readOnlyLock = "tollgate_test_server_read_only"

// readOnlyWait bounds the wait for another package's test to give the lock up: a watchdog for
// a holder that hangs, far longer than any read_only spell a test makes (seconds).
const readOnlyWait = 5 * time.Minute

// ServerReadOnly returns what sets the shared test server's global read_only from root (the
// tests' account), as a failover's demotion of a primary or an operator's maintenance does.
// `go test ./...` runs packages side by side on one server: two packages' tests each turning
// read_only on and off would end each other's spells midway (admin's setting it off while a
// holds test counts on its batches being refused, say). So the test holds a server-wide lock
// (GET_LOCK, on a connection of its own) from here to its end, taken by every test that turns
// read_only on: such tests run one at a time whatever package they are in. At cleanup
// read_only is set off, then the lock released; cleanups run last first, so a test that
// registers its ledger audit or its database's drop before calling this gets the server
// taking writes again before those run.
func ServerReadOnly(t testing.TB, root *sqlx.DB) func(on bool) {
	t.Helper()
	holdReadOnlyLock(t, root)
	set := func(on bool) {
		q := "SET GLOBAL read_only = 0"
		if on {
			q = "SET GLOBAL read_only = 1"
		}
		if _, err := root.Exec(q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { set(false) }) // before the lock's release, registered earlier
	return set
}

// NoReadOnlySpell keeps other tests' read_only spells off the shared server for the rest of
// the test: one whose writes go through an account without SUPER or READ_ONLY ADMIN (a
// gateway's least-privileged user, a migration without DDL rights) has them refused during
// such a spell, which another package's test may start at any moment under `go test ./...`.
// It holds the lock ServerReadOnly's tests hold.
func NoReadOnlySpell(t testing.TB, root *sqlx.DB) {
	t.Helper()
	holdReadOnlyLock(t, root)
}

// holdReadOnlyLock takes the server-wide lock of the tests that turn read_only on, on a
// connection of root's own, and gives it back at the test's end.
func holdReadOnlyLock(t testing.TB, root *sqlx.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readOnlyWait+30*time.Second)
	defer cancel()
	conn, err := root.Connx(ctx)
	if err != nil {
		t.Fatalf("connection for the read_only lock: %v", err)
	}
	// Idle for the test's life: the handle's wait_timeout (holds.Open's, minutes) must not end
	// the session, and the lock with it, midway.
	if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 3600"); err != nil {
		conn.Close()
		t.Fatalf("read_only lock session: %v", err)
	}
	var got *int64
	if err := conn.GetContext(ctx, &got, "SELECT GET_LOCK(?, ?)", readOnlyLock, int(readOnlyWait/time.Second)); err != nil || got == nil || *got != 1 {
		conn.Close()
		t.Fatalf("GET_LOCK(%s): %v, %v; another test kept the server's read_only lock past %v", readOnlyLock, got, err, readOnlyWait)
	}
	t.Cleanup(func() {
		_, _ = conn.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", readOnlyLock)
		conn.Close()
	})
}
