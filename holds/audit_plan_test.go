package holds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestAuditReadsRunHoldsInOnePass: run_holds keeps a row per call until a prune, millions on a
// gateway in production, and Audit (`gateway audit`, every test's ledger check) reads the whole
// of it. Measured on 2 000 000 settled holds of 20 000 users: the day check read run_holds
// twice and grouped both through temporary tables that spilled to disk (18 M row reads, 57 s
// with the table in memory), and the prepaid check summed each user's holds in a subquery per
// user, one primary-key lookup per hold (5.6 s in memory, 134 s with a buffer pool smaller than
// the table). Each statement must read run_holds once, as a scan, never through a subquery
// run per user.
func TestAuditReadsRunHoldsInOnePass(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	// Enough users and days that a lookup per user looks cheap to the optimizer: releases
	// charge nothing, so the books stay sound without ledger rows.
	users := make([]holds.User, 50)
	for i := range users {
		users[i] = f.user(fmt.Sprintf("auditor-%02d", i), "standard")
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var q strings.Builder
	var args []any
	q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at, created_at, settled_at, settle_source) VALUES `)
	for i := 0; i < 2000; i++ {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString("(?, ?, 'settled', 0, 0, ?, ?, ?, 'release')")
		at := start.Add(time.Duration(i) * 17 * time.Minute)
		args = append(args, fmt.Sprintf("r_audit_%05d", i), users[i%len(users)].ID, at, at, at)
	}
	if _, err := f.db.ExecContext(ctx, q.String(), args...); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE run_holds, users, grants, usage_days, pruned_runs"); err != nil {
		t.Fatal(err)
	}
	for name, stmt := range holds.AuditQueries {
		t.Run(name, func(t *testing.T) {
			reads := runHoldsReads(t, f, stmt)
			if len(reads) != 1 || reads[0] != "ALL" {
				t.Fatalf("the %s check reads run_holds as %v, want one scan [ALL]", name, reads)
			}
		})
	}
}

// runHoldsReads EXPLAINs stmt and returns how each of its reads of run_holds is made (its
// access type, prefixed with DEPENDENT for a subquery run once per row of the outer query).
func runHoldsReads(t *testing.T, f *acctFixture, stmt string) []string {
	t.Helper()
	rows, err := f.db.QueryxContext(f.ctx(), "EXPLAIN "+stmt)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		row := map[string]any{}
		if err := rows.MapScan(row); err != nil {
			t.Fatal(err)
		}
		if table := str(row["table"]); table != "run_holds" && table != "h" { // h: run_holds, as the prepaid check named it
			continue
		}
		access := str(row["type"])
		if strings.Contains(str(row["select_type"]), "DEPENDENT") || strings.Contains(str(row["select_type"]), "LATERAL") {
			access = "DEPENDENT " + access
		}
		out = append(out, access)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// str reads an EXPLAIN column, which the driver returns as bytes, or nil for NULL.
func str(v any) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}
