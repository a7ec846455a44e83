package holds_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSingleStatementsCommitWhateverTheDSNSaysOfAutocommit: the store's writes outside a
// transaction of its own (a user's creation, a run call's record, a hold's extension, a
// heartbeat) are each whole on their own. Under autocommit=0 in mysql_dsn each opened a
// transaction nothing committed: the row was seen by no other connection, and lost when the
// connection ended. Open owns the setting, as it owns the others the money code relies on.
func TestSingleStatementsCommitWhateverTheDSNSaysOfAutocommit(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["autocommit"] = "0"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	other, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })

	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	name := "autocommit-" + testenv.RandomID(3)
	if _, err := st.CreateUser(ctx, name, "standard"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := other.GetContext(ctx, &n, "SELECT COUNT(*) FROM users WHERE name = ?", name); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("a user created under a DSN's autocommit=0 is seen by %d rows from another connection, want 1", n)
	}
}
