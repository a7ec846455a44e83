package holds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAuditNamesTheUserOfEveryMismatchPastANameBatch: Audit names the users of its mismatches
// a thousand ids to a statement, so that books gone badly wrong still read in bounded
// statements. Every mismatch is named, on each side of a batch's edge: 1001 users whose
// prepaid credits no grant explains are 1001 mismatches, each with its user's name.
func TestAuditNamesTheUserOfEveryMismatchPastANameBatch(t *testing.T) {
	db := testenv.MySQL(t)
	ctx := context.Background()
	const users = 1001
	var q strings.Builder
	q.WriteString("INSERT INTO users (name, plan, prepaid_micro) VALUES ")
	for i := range users {
		if i > 0 {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "('audit-names-%04d', 'standard', 1)", i)
	}
	if _, err := db.ExecContext(ctx, q.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("UPDATE users SET prepaid_micro = 0") }) // books sound again for any check at cleanup
	bad, err := holds.Audit(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	unnamed := 0
	for _, m := range bad {
		if m.User == "" {
			unnamed++
		}
	}
	if len(bad) != users || unnamed != 0 {
		t.Errorf("audit of %d users with unexplained prepaid credits: %d mismatches, %d of them unnamed; want %d, all named",
			users, len(bad), unnamed, users)
	}
}
