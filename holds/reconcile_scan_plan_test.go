package holds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestReconcileScanReadsTheIndexInOrder: the reconciler drains expired holds a batch at a time,
// oldest first. With both live states in one IN list the (state, expires_at) index gave two
// ranges that only a sort of every expired hold after the cursor could merge, each batch: a
// pass over a backlog of n holds sorted n²/batch rows (0.5 s for 20 000, minutes for the
// backlog a fleet's outage leaves). Each state's part must read the index in its order, with no
// sort of its own; only the two parts' few rows are merged by one. After a cursor each part's
// range must start at it (scanStartsAtItsCursor).
func TestReconcileScanReadsTheIndexInOrder(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	u := f.user("backlog", "standard")
	// To the microsecond, as every expiry read back (and so every cursor) is: a bound with
	// nanoseconds, which the driver sends as written, is no range bound to the server, and the
	// scan after a cursor read the index from its start.
	old := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	// A backlog of 3 000 expired holds in a table that, as in production, holds ten times as
	// many settled ones (on a table of live holds alone a scan of it all is as cheap).
	for chunk := 0; chunk < 11; chunk++ {
		var q strings.Builder
		var args []any
		q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at, settled_at, settle_source) VALUES `)
		for i := 0; i < 3000; i++ {
			if i > 0 {
				q.WriteByte(',')
			}
			id := fmt.Sprintf("r_backlog_%02d_%05d", chunk, i)
			at := old.Add(time.Duration(i) * time.Millisecond)
			switch {
			case chunk > 0:
				q.WriteString("(?, ?, 'settled', 0, 0, ?, ?, 'release')")
				args = append(args, id, u.ID, at, at)
			case i%3 == 0:
				q.WriteString("(?, ?, 'queued', 0, 0, ?, NULL, NULL)")
				args = append(args, id, u.ID, at)
			default:
				q.WriteString("(?, ?, 'running', 0, 0, ?, NULL, NULL)")
				args = append(args, id, u.ID, at)
			}
		}
		if _, err := f.db.ExecContext(ctx, q.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
	// Release them at the end: they hold nothing, and the ledger check reads settled rows only.
	t.Cleanup(func() {
		if _, err := f.db.ExecContext(ctx, "UPDATE run_holds SET state = 'settled', settled_at = NOW(6), settle_source = 'release' WHERE user_id = ?", u.ID); err != nil {
			t.Error(err)
		}
	})
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE run_holds"); err != nil {
		t.Fatal(err)
	}
	for name, after := range map[string]string{"first batch": "", "after a cursor": "r_backlog_00_00500"} {
		t.Run(name, func(t *testing.T) {
			stmt, args := holds.ExpiredQuery(old.Add(500*time.Millisecond), after, 200)
			rows, err := f.db.QueryxContext(ctx, "EXPLAIN "+stmt, args...)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			parts := 0
			for rows.Next() {
				row := map[string]any{}
				if err := rows.MapScan(row); err != nil {
					t.Fatal(err)
				}
				if str(row["table"]) != "run_holds" {
					continue
				}
				parts++
				if extra := str(row["Extra"]); strings.Contains(extra, "filesort") || str(row["key"]) != "idx_run_holds_state_expires" {
					t.Errorf("a part of the scan reads run_holds by %q with %q, want the (state, expires_at) index in its order", str(row["key"]), extra)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if parts != 2 {
				t.Errorf("the scan reads run_holds %d times, want once per live state", parts)
			}
			if after != "" {
				scanStartsAtItsCursor(t, f, stmt, args, 200)
			}
		})
	}
}

// scanStartsAtItsCursor runs the scan after a cursor and checks, by the session's count of
// index entries read, that each part read about a batch: the plain `expires_at >= ?` bound
// starts each index range at the cursor. Without it a range starts at the oldest expired hold,
// and every entry before the cursor is read and filtered out by the OR, each batch: a pass over
// a backlog of n holds read n²/batch entries, as the sort it replaced did. The plan is the
// same either way, so EXPLAIN cannot tell, and the OR is checked inside the engine (index
// condition pushdown), so neither can ANALYZE's r_rows: MariaDB's Handler_icp_attempts counts
// the entries it checked.
func scanStartsAtItsCursor(t *testing.T, f *acctFixture, stmt string, args []any, limit int) {
	t.Helper()
	ctx := f.ctx()
	conn, err := f.db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	attempts := func() int {
		var name string
		var n int
		if err := conn.QueryRowxContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_icp_attempts'").Scan(&name, &n); err != nil {
			t.Fatalf("the server's count of index entries read: %v", err)
		}
		return n
	}
	before := attempts()
	var got []holds.Run
	if err := conn.SelectContext(ctx, &got, stmt, args...); err != nil {
		t.Fatal(err)
	}
	read := attempts() - before
	switch {
	case len(got) != limit:
		t.Fatalf("the scan after a cursor listed %d holds, want a batch of %d", len(got), limit)
	case read < limit:
		t.Fatalf("the scan read %d index entries by Handler_icp_attempts for %d holds: the plan no longer checks its OR in the engine, and the count no longer measures it", read, limit)
	case read > 2*limit+20:
		t.Errorf("the scan after a cursor read %d index entries for a batch of %d from its two parts: their ranges do not start at the cursor", read, limit)
	}
}
