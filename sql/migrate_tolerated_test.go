package sql_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
	tgsql "github.com/tollgate/tollgate/sql"
)

// TestOnlyALoneDropIsTakenAsDoneWhenItsIndexIsGone: a rerun after a crash takes "can't drop,
// check that it exists" (1091) as the drop done before — but only for a statement that is
// that drop alone. An ALTER is atomic: one that adds a column and drops an index, refused for
// the index (dropped by hand, a typo), added nothing, and taken as done it would be recorded
// as applied with its column missing.
func TestOnlyALoneDropIsTakenAsDoneWhenItsIndexIsGone(t *testing.T) {
	db := testenv.MySQL(t)
	if _, err := db.Exec("CREATE TABLE mig_probe (a INT)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE mig_probe") })
	for _, c := range []struct {
		stmt string
		want bool
	}{
		{"ALTER TABLE mig_probe DROP INDEX idx_gone", true},
		{"alter table  mig_probe\n  drop index `idx_gone`", true},
		{"ALTER TABLE mig_probe ADD COLUMN b INT, DROP INDEX idx_gone", false},
		{"ALTER TABLE mig_probe DROP INDEX idx_gone, ADD COLUMN b INT", false},
		{"ALTER TABLE mig_probe DROP COLUMN gone", false},
	} {
		_, err := db.Exec(c.stmt)
		if err == nil {
			t.Fatalf("%q: ran, want it refused 1091", c.stmt)
		}
		if got := tgsql.AlreadyApplied(c.stmt, err); got != c.want {
			t.Errorf("%q refused (%v): taken as already applied %v, want %v", c.stmt, err, got, c.want)
		}
	}
	var cols int
	if err := db.Get(&cols, "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'mig_probe' AND column_name = 'b'"); err != nil {
		t.Fatal(err)
	}
	if cols != 0 {
		t.Fatal("column b added by a refused ALTER: an ALTER is not atomic here, and the rule's premise fails")
	}
}
