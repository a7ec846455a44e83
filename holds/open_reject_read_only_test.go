package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestReadOnlyRefusalsAreTheStoresWhateverTheDSNSaysOfRejectReadOnly: the driver's
// rejectReadOnly=true (its README's advice for failovers) answers a statement refused read_only
// (1290, 1792) as driver.ErrBadConn, a connection found broken before anything was sent. The
// store then no longer knew the refusal for one: a batch's retries drew the pool's other
// connections to the demoted server one by one (each refused, none closed with it:
// TestReadOnlyConnectionsLeaveThePool), and a user's creation, which waits out a refusal
// read_only but never sends again a statement that may have landed, was answered the error at
// once. Open sets it back to false, as it does clientFoundRows.
func TestReadOnlyRefusalsAreTheStoresWhateverTheDSNSaysOfRejectReadOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RejectReadOnly = true
	db := testenv.Open(t, cfg.FormatDSN())
	st, logs, u := demotableStore(ctx, t, db, "ro-reject-")

	t.Run("batch", func(t *testing.T) { batchOnADemotedPool(ctx, t, db, st, logs, u) })
	t.Run("user creation", func(t *testing.T) {
		demote(ctx, t, db, 8)
		if _, err := st.CreateUser(ctx, "ro-reject-new-"+testenv.RandomID(3), "standard"); err != nil {
			t.Fatalf("user created with the pool's connections read-only and a new one writable: %v; want it created on a new connection", err)
		}
		checkPoolWritable(ctx, t, db)
	})
}
