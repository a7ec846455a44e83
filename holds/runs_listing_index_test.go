package holds_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestRunListingReadsAPageNotTheTable: run_holds keeps every hold ever taken, and the
// operator's run listing (GET /admin/runs, `gateway runs`) is ordered newest first. Without an
// index on created_at every page read and sorted every run of the whole table, so the listing
// slowed down with the gateway's age. A page must read about as many rows as it shows; one
// user's, at most that user's runs (the user's index, sorted: a second index per user cost
// every admission more than it saves an operator).
func TestRunListingReadsAPageNotTheTable(t *testing.T) {
	f := newAcctFixture(t)
	ctx := f.ctx()
	// One connection, so that the session's handler counters see the listing's statements.
	f.db.SetMaxOpenConns(1)
	users := []holds.User{f.user("old-timer", "standard"), f.user("newcomer", "standard")}
	const perUser, limit = 3000, 50
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, u := range users {
		for lo := 0; lo < perUser; lo += 500 {
			var q strings.Builder
			var args []any
			q.WriteString(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at, created_at, settled_at, settle_source) VALUES `)
			for i := lo; i < lo+500; i++ {
				if i > lo {
					q.WriteByte(',')
				}
				q.WriteString("(?, ?, 'settled', 0, 0, ?, ?, ?, 'release')")
				at := start.Add(time.Duration(i) * time.Minute)
				args = append(args, fmt.Sprintf("r_%s_%05d", u.Name, i), u.ID, at, at, at)
			}
			if _, err := f.db.ExecContext(ctx, q.String(), args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.db.ExecContext(ctx, "ANALYZE TABLE run_holds"); err != nil {
		t.Fatal(err)
	}
	const page = 4*limit + 20 // rows a page may read
	// The run the "next page" cases go on after, as a page that ended on it would answer.
	at := start.Add(time.Duration(perUser-limit) * time.Minute)
	boundary := holds.Run{RunID: fmt.Sprintf("r_%s_%05d", users[1].Name, perUser-limit), CreatedAt: at, SettledAt: sql.NullTime{Time: at, Valid: true}}
	for _, tc := range []struct {
		name string
		f    holds.RunFilter
		most int
	}{
		{"every run", holds.RunFilter{}, page},
		{"one user's", holds.RunFilter{UserID: users[0].ID}, perUser + page},
		{"settled since a day", holds.RunFilter{State: holds.StateSettled, Since: start.Add(24 * time.Hour)}, page},
		{"next page", holds.RunFilter{After: fmt.Sprintf("r_%s_%05d", users[1].Name, perUser-limit)}, page},
		{"settled in a day", holds.RunFilter{SettledSince: start.Add(24 * time.Hour), SettledUntil: start.Add(48 * time.Hour)}, page},
		{"settled, next page", holds.RunFilter{SettledSince: start, After: fmt.Sprintf("r_%s_%05d", users[1].Name, perUser-limit)}, page},
		{"next page, by its cursor", holds.RunFilter{After: (holds.RunFilter{}).Cursor(boundary)}, page},
		{"settled, next page, by its cursor", holds.RunFilter{SettledSince: start, After: (holds.RunFilter{SettledSince: start}).Cursor(boundary)}, page},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.Limit = limit
			before := handlerReads(ctx, t, f)
			runs, err := f.store.ListRuns(ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			read := handlerReads(ctx, t, f) - before
			if len(runs) != limit {
				t.Fatalf("%d runs listed, want a full page of %d", len(runs), limit)
			}
			if read > int64(tc.most) {
				t.Fatalf("listing a page of %d runs read %d rows of %d, want at most %d", limit, read, 2*perUser, tc.most)
			}
		})
	}
}

// handlerReads sums the session's row reads (Handler_read_*), less the reads of the status
// query itself, which are counted before it returns.
func handlerReads(ctx context.Context, t *testing.T, f *acctFixture) int64 {
	t.Helper()
	rows, err := f.db.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sum int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}
