package holds_test

import (
	"fmt"
	"testing"
	"time"
)

// TestUsageReportOfADayReadsThatDay: usage_days keeps a row per user and day for good, and
// pruned_runs a row per user, day and model of every day ever pruned: both only grow. The
// usage report of all users (GET /admin/reports/usage, `gateway report`) read each of them
// whole, whatever its range: both are keyed by user first, and the report selects by day.
// Measured on 10 000 users with 60 days of ledger and 120 days of pruned sums (600 000 and
// 300 000 rows), a report of one day read 900 000 rows there for the 20 000 it needed, and a
// year's ledger is 3.6 million. A report of one day must read about that day's rows, not the
// tables' history; a user's report reads that user's rows by the primary key, as before.
func TestUsageReportOfADayReadsThatDay(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	// One connection, so that the session's handler counters see the report's statements.
	f.db.SetMaxOpenConns(1)
	const users, days = 30, 120
	var ids []uint64
	for i := range users {
		ids = append(ids, f.user(fmt.Sprintf("reported-%02d", i), "standard").ID)
	}
	last := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	// Days that charged nothing (released runs), so the books balance without runs behind them.
	for _, id := range ids {
		ledger, pruned := "INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES ", `INSERT INTO pruned_runs
			(user_id, day, model, runs, calls, in_tok, out_tok) VALUES `
		var args []any
		for d := range days {
			if d > 0 {
				ledger, pruned = ledger+", ", pruned+", "
			}
			ledger, pruned = ledger+"(?, ?, 0, 0)", pruned+"(?, ?, 'fake-gpt', 3, 3, 30, 3)"
			args = append(args, id, last.AddDate(0, 0, -d))
		}
		for _, q := range []string{ledger, pruned} {
			if _, err := f.db.ExecContext(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE users, run_holds, usage_days, pruned_runs"); err != nil {
		t.Fatal(err)
	}
	day := last.AddDate(0, 0, -days/2)
	for _, tc := range []struct {
		name string
		user uint64
		rows int
	}{
		{"every user", 0, users},
		{"one user", ids[7], 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := handlerReads(ctx, t, f)
			rep, err := f.store.Usage(ctx, day, day, tc.user)
			if err != nil {
				t.Fatal(err)
			}
			read := handlerReads(ctx, t, f) - before
			if len(rep.Rows) != tc.rows || rep.Totals.Runs != int64(3*tc.rows) {
				t.Fatalf("the report of %s has %d rows of %d runs, want %d of %d", day.Format(time.DateOnly), len(rep.Rows), rep.Totals.Runs, tc.rows, 3*tc.rows)
			}
			// Per user of the day: its ledger and pruned rows, each through an index and then its
			// row, its user row, and the temporary tables of the report's grouping (about 20 reads
			// in all on MariaDB 10.11). A scan of either table is users × days rows.
			if most := 30 * users; read > int64(most) {
				t.Fatalf("the report of one day read %d rows (%d users, %d days kept in usage_days and pruned_runs), want at most %d", read, users, days, most)
			}
		})
	}
}
