package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// The operator's listing of runs, paged by a cursor that holds its position (a run pruned
// between two pages does not break the listing).

// RunFilter selects runs for ListRuns. Zero fields do not filter.
type RunFilter struct {
	UserID uint64
	State  State
	Since  time.Time // created_at >= Since
	Until  time.Time // created_at < Until
	// SettledSince and SettledUntil select settled runs by when they settled (settled_at >=
	// SettledSince, < SettledUntil), the day the usage report and the day ledger charge them
	// to: a run admitted before midnight and settled after it is the next day's, and a named
	// or reconciled run may settle long after it began. Either one lists settled runs only,
	// newest settlement first, so that a billing team can list the runs behind a report day.
	SettledSince, SettledUntil time.Time
	// After is where an earlier page ended: only runs listed after it (older, or as old with
	// a smaller run id) are listed. Runs admitted in one batch share created_at, so Until
	// alone cannot page past them. It is the Cursor of that page's last run, which holds the
	// run's position, or (the cursor of before) that run's id, which is looked up and so
	// fails once the run is pruned.
	After string
	Limit int // 1-maxListRows
}

// bySettlement says whether f lists runs by when they settled rather than when they began.
func (f RunFilter) bySettlement() bool { return !f.SettledSince.IsZero() || !f.SettledUntil.IsZero() }

// UserRun is a run with its owner's name, as an operator lists it.
type UserRun struct {
	Run
	UserName string `db:"user_name"`
}

// ListRuns lists runs newest first: by when they began, or, with a settlement window, by
// when they settled (both orders end on the run id, which pages through runs of one batch).
func (s *Store) ListRuns(ctx context.Context, f RunFilter) ([]UserRun, error) {
	if f.Limit <= 0 || f.Limit > maxListRows {
		return nil, fmt.Errorf("list runs: %w: limit %d out of range 1-%d", ErrBadFilter, f.Limit, maxListRows)
	}
	// The column the listing is ordered by, and paged on: settled_at has its own index (the
	// report's), which InnoDB ends with the primary key, run_id.
	at := "created_at"
	if f.bySettlement() {
		at = "settled_at"
		if f.State != "" && f.State != StateSettled {
			return nil, fmt.Errorf("list runs: %w: a settlement window lists settled runs, not %q ones", ErrBadFilter, f.State)
		}
		f.State = StateSettled
	}
	var where []string
	var args []any
	if f.UserID != 0 {
		where, args = append(where, "user_id = ?"), append(args, f.UserID)
	}
	switch f.State {
	case "":
	case StateQueued, StateRunning, StateSettled:
		where, args = append(where, "state = ?"), append(args, string(f.State))
	default:
		return nil, fmt.Errorf("list runs: %w: state %q, want queued, running or settled", ErrBadFilter, f.State)
	}
	for _, t := range []struct {
		column, op, name string
		t                time.Time
	}{
		{"created_at", ">=", "since", f.Since}, {"created_at", "<", "until", f.Until},
		{"settled_at", ">=", "settled since", f.SettledSince}, {"settled_at", "<", "settled until", f.SettledUntil},
	} {
		if t.t.IsZero() {
			continue
		}
		if !storableTime(t.t) {
			return nil, fmt.Errorf("list runs: %w: %s %s is outside the years 1-9999", ErrBadFilter, t.name, t.t.UTC().Format(time.RFC3339))
		}
		where, args = append(where, t.column+" "+t.op+" ?"), append(args, t.t.UTC())
	}
	if f.After != "" {
		pos, err := s.runPosition(ctx, f.After, at)
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		where = append(where, "("+at+" < ? OR ("+at+" = ? AND run_id < ?))")
		args = append(args, pos.at, pos.at, pos.runID)
	}
	q := "SELECT " + runColumns + ", COALESCE((SELECT u.name FROM users u WHERE u.id = run_holds.user_id), '') AS user_name FROM run_holds"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY " + at + " DESC, run_id DESC LIMIT ?"
	args = append(args, f.Limit)
	out := []UserRun{}
	err := s.withRetry(ctx, "list runs", func() error {
		out = out[:0]
		return s.db.SelectContext(ctx, &out, q, args...)
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}

// runCursorTime is the layout of a run cursor's time: UTC to the microsecond, the precision
// of created_at and settled_at, so that the position it names is exact.
const runCursorTime = "2006-01-02T15:04:05.000000Z"

// runOrders names the column a run listing is ordered by in its cursors.
var runOrders = map[string]string{"created_at": "created", "settled_at": "settled"}

// Cursor is the After that lists the runs after r in the listing f selects:
// ORDER/TIME/RUN_ID, where ORDER is created or settled (the column the listing is ordered
// by), TIME r's value of it and RUN_ID r's id. It carries the position, so the next page
// needs no row of r: a run pruned between two pages (gateway prune deletes old settled
// runs) no longer breaks a walk, as its id as the cursor did.
func (f RunFilter) Cursor(r Run) string {
	order, t := "created", r.CreatedAt
	if f.bySettlement() {
		order, t = "settled", r.SettledAt.Time
	}
	return order + "/" + t.UTC().Format(runCursorTime) + "/" + r.RunID
}

// runPos is where a page of runs ended: the value of the listing's order column and the run
// id of its last run.
type runPos struct {
	at    time.Time
	runID string
}

// runPosition reads after, the cursor of a listing ordered by column at: a Cursor holds the
// position; anything else is taken for a run id, the cursor of before, whose row is read.
func (s *Store) runPosition(ctx context.Context, after, at string) (runPos, error) {
	order, rest, ok := strings.Cut(after, "/")
	if ok && (order == "created" || order == "settled") {
		return parseRunCursor(after, order, rest, runOrders[at])
	}
	var t sql.NullTime
	err := s.withRetry(ctx, "list runs", func() error {
		return s.db.GetContext(ctx, &t, "SELECT "+at+" FROM run_holds WHERE run_id = ?", after)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return runPos{}, fmt.Errorf("%w: %q is no run (a pruned run's id cannot be paged from: send the last_id a page answers, which holds the position)", ErrBadAfter, after)
	}
	if err != nil {
		return runPos{}, fmt.Errorf("read the position of run %q: %w", after, err)
	}
	if !t.Valid {
		// Only a listing by settlement reads a nullable column: no page of it ends on a
		// run that has not settled.
		return runPos{}, fmt.Errorf("%w: %q has not settled", ErrBadAfter, after)
	}
	return runPos{at: t.Time, runID: after}, nil
}

// parseRunCursor reads the TIME/RUN_ID rest of a Cursor of order, for a listing in order want.
// A cursor of the other order is refused: its time is not a position in this listing.
func parseRunCursor(after, order, rest, want string) (runPos, error) {
	if order != want {
		return runPos{}, fmt.Errorf("%w: %q is the cursor of a listing by %s, and this one lists by %s: page with the same filters",
			ErrBadAfter, after, orderName(order), orderName(want))
	}
	ts, runID, _ := strings.Cut(rest, "/")
	t, err := time.Parse(runCursorTime, ts)
	if err != nil || !storableTime(t) {
		return runPos{}, fmt.Errorf("%w: %q: its time %q is not YYYY-MM-DDTHH:MM:SS.ffffffZ (UTC, six digits of fraction)", ErrBadAfter, after, ts)
	}
	// The column's collation compares other bytes without an error and matches nothing, and
	// no run id is longer than the column.
	if runID == "" || !utf8.ValidString(runID) || utf8.RuneCountInString(runID) > 64 {
		return runPos{}, fmt.Errorf("%w: %q: its run id is not 1-64 characters of UTF-8 text", ErrBadAfter, after)
	}
	return runPos{at: t, runID: runID}, nil
}

// orderName is how an error names a run listing's order.
func orderName(order string) string {
	if order == "settled" {
		return "settlement"
	}
	return "creation"
}
