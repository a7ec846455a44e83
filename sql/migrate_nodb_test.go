package sql_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	tgsql "github.com/tollgate/tollgate/sql"
)

// TestMigrateWithoutDatabaseSaysSo: a DSN that names no database (".../" with nothing after
// the slash, an easy slip) made DATABASE() NULL, the lock name NULL, and GET_LOCK answer NULL
// at once, which Migrate reported as "another migration holds the lock for over 60 s": the
// operator went looking for a runner that did not exist. It must say what is wrong.
func TestMigrateWithoutDatabaseSaysSo(t *testing.T) {
	root := os.Getenv("TOLLGATE_TEST_MYSQL_DSN") // the server, no database
	if root == "" {
		t.Fatal("TOLLGATE_TEST_MYSQL_DSN is not set: run the tests with `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := holds.OpenForMigrate(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = tgsql.Migrate(ctx, db.DB)
	if err == nil {
		t.Fatal("migrated a connection with no database selected")
	}
	if strings.Contains(err.Error(), "lock") || !strings.Contains(err.Error(), "no database") {
		t.Fatalf("error %q; want it to say the DSN names no database", err)
	}
	if _, err := tgsql.Pending(ctx, db.DB); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Fatalf("pending: %v; want it to say the DSN names no database", err)
	}
}
