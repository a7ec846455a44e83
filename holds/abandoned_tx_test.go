package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAbandonedTransactionReleasesItsLocks: a gateway whose host dies (or whose network
// partitions) between a batch's two scripts leaves MariaDB waiting, inside the transaction,
// for a command that never comes — with the user rows it locked held. No FIN reaches the
// server, so it waits wait_timeout, 8 hours by default: every other gateway's admission of
// those users fails its 3 s lock wait (503) until then. The gateway's sessions bound that wait
// (holds.SessionWaitTimeout), and the server then drops the connection and its locks.
func TestAbandonedTransactionReleasesItsLocks(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t)
	db := testenv.Open(t, dsn)
	var wait int
	if err := db.GetContext(ctx, &wait, "SELECT @@SESSION.wait_timeout"); err != nil {
		t.Fatal(err)
	}
	if want := int(holds.SessionWaitTimeout / time.Second); wait != want {
		t.Fatalf("session wait_timeout %d s, want %d: a dead client's transaction keeps its locks that long", wait, want)
	}

	// The same mechanism, shortened through the DSN (which the gateway leaves as the operator
	// set it): a transaction whose client goes silent holding a user's lock loses it.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wait_timeout"] = "2"
	short := testenv.Open(t, cfg.FormatDSN())
	if _, err := short.ExecContext(ctx, "INSERT INTO users (name, plan) VALUES ('abandoned', 'standard')"); err != nil {
		t.Fatal(err)
	}
	silent, err := short.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	if _, err := silent.ExecContext(ctx, "START TRANSACTION"); err != nil {
		t.Fatal(err)
	}
	if _, err := silent.ExecContext(ctx, "SELECT id FROM users WHERE name = 'abandoned' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	// silent now says nothing more, as a dead host would.
	deadline := time.Now().Add(20 * time.Second)
	for {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.ExecContext(ctx, "SELECT id FROM users WHERE name = 'abandoned' FOR UPDATE")
		_ = tx.Rollback()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the silent transaction's lock is still held after 20 s: %v", err)
		}
	}
}
