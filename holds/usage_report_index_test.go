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

// TestUserUsageReportReadsThatUsersDays: a user's usage report (GET
// /admin/reports/usage?user=, `gateway report -user`, and what README advises for a busy range:
// a report user by user) selected the user's settled runs through the user's index, (user_id,
// state, expires_at), and filtered them by settled_at row by row: every report read every run
// the user had kept, whatever its range. Measured on a user with 15 000 kept runs over 60 days,
// a report of one day read 13 000 rows for its 250 (3 s with the pages not in memory), and a
// report of every user, user by user, read the whole table once per day reported. It must read
// about the user's runs of its days.
func TestUserUsageReportReadsThatUsersDays(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	f.db.SetMaxOpenConns(1)
	u := f.user("long-history", "standard")
	// Neighbours settling as much each day: the day's runs of every user are no shortcut either.
	ids := []uint64{u.ID}
	for i := range 20 {
		ids = append(ids, f.user(fmt.Sprintf("neighbour-%02d", i), "standard").ID)
	}
	const days, perDay = 30, 20
	last := time.Date(2026, 6, 30, 12, 0, 0, 0, time.UTC)
	// Released runs, settled at 0: the books balance without ledger rows.
	for d := range days {
		q := `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, model, expires_at, created_at, settled_at, settle_source) VALUES `
		var args []any
		for k, id := range ids {
			for i := range perDay {
				if k > 0 || i > 0 {
					q += ", "
				}
				q += "(?, ?, 'settled', 0, 0, 'fake-gpt', ?, ?, ?, 'release')"
				at := last.AddDate(0, 0, -d).Add(time.Duration(i) * time.Minute)
				args = append(args, fmt.Sprintf("r_hist_%02d_%02d_%02d", k, d, i), id, at, at, at)
			}
		}
		if _, err := f.db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE users, run_holds, usage_days, pruned_runs"); err != nil {
		t.Fatal(err)
	}
	day := last.AddDate(0, 0, -days/2)
	before := handlerReads(ctx, t, f)
	rep, err := f.store.Usage(ctx, day, day, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	read := handlerReads(ctx, t, f) - before
	if len(rep.Rows) != 1 || rep.Totals.Runs != perDay {
		t.Fatalf("the report of %s has %d rows of %d runs, want 1 of %d", day.Format(time.DateOnly), len(rep.Rows), rep.Totals.Runs, perDay)
	}
	// The day's runs through the index and their rows, and the grouping's temporary tables
	// (about 7 reads a run in all on MariaDB 10.11): less than either the user's history or
	// the day's runs of every user.
	if most := 10 * perDay; read > int64(most) {
		t.Fatalf("a user's report of one day read %d rows (the user keeps %d runs over %d days; the day has %d of every user), want at most %d",
			read, days*perDay, days, len(ids)*perDay, most)
	}
}
