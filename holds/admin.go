package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// This file is the operator's side of the store: what the admin API and the gateway's
// subcommands need beyond the money paths. Nothing here moves money except through Grant;
// the statements that change a user touch only that user's row, one statement each, so they
// need no place in the lock order beyond the users row they update.

// Refusals of admin operations.
var (
	ErrUnknownPlan = errors.New("unknown plan")
	ErrKeyNotFound = errors.New("no live key with that value")
	ErrBadFilter   = errors.New("bad filter")
	// ErrBadAfter is a listing's cursor (after) that cannot be one: a run or key that does not
	// exist, another user's key, a user name that is not UTF-8. It is an ErrBadFilter too.
	ErrBadAfter = fmt.Errorf("%w: bad after", ErrBadFilter)
)

// HasPlan reports whether plan is configured.
func (s *Store) HasPlan(plan string) bool {
	_, ok := s.plans[plan]
	return ok
}

// PlanNames lists the configured plans, sorted.
func (s *Store) PlanNames() []string {
	out := make([]string, 0, len(s.plans))
	for name := range s.plans {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// UserDetail is a user as an operator sees it: the stored overrides (nil when the plan
// decides) and the effective terms admission would apply right now.
type UserDetail struct {
	ID             uint64
	Name           string
	Plan           string
	AllowanceMicro *int64 // override; nil: the plan's
	DiscountBP     *int   // override
	MaxInFlight    *int   // override
	PrepaidMicro   int64
	DisabledAt     *time.Time
	CreatedAt      time.Time
	Effective      Plan
}

type userDetailRow struct {
	userRow
	CreatedAt time.Time `db:"created_at"`
}

func (s *Store) detail(r userDetailRow) UserDetail {
	d := UserDetail{ID: r.ID, Name: r.Name, Plan: r.Plan, PrepaidMicro: r.PrepaidMicro, CreatedAt: r.CreatedAt,
		Effective: s.plan(r.userRow)}
	if r.AllowanceMicro.Valid {
		v := r.AllowanceMicro.Int64
		d.AllowanceMicro = &v
	}
	if r.DiscountBP.Valid {
		v := int(r.DiscountBP.Int64)
		d.DiscountBP = &v
	}
	if r.MaxInFlight.Valid {
		v := int(r.MaxInFlight.Int64)
		d.MaxInFlight = &v
	}
	if r.DisabledAt.Valid {
		t := r.DisabledAt.Time
		d.DisabledAt = &t
	}
	return d
}

// UserDetail reads one user by name.
func (s *Store) UserDetail(ctx context.Context, name string) (UserDetail, error) {
	var r userDetailRow
	err := s.withRetry(ctx, "user detail", func() error {
		return s.db.GetContext(ctx, &r, "SELECT "+userColumns+", created_at FROM users WHERE name = ?", name)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return UserDetail{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
	}
	if err != nil {
		return UserDetail{}, fmt.Errorf("user %q: %w", name, err)
	}
	return s.detail(r), nil
}

// ListUsers lists users by name, at most limit of them, starting after the name after
// (empty: from the start) so a long list can be paged. The order is total: names are unique
// under the column's collation (uq_users_name), the one ORDER BY and > compare by, so no user
// is skipped or listed twice across pages; after need not be a user's name. It must be UTF-8
// text (ErrBadAfter): MariaDB compares other bytes without an error and lists nothing, a last
// page that hid every user after it.
func (s *Store) ListUsers(ctx context.Context, after string, limit int) ([]UserDetail, error) {
	if limit <= 0 || limit > 10_000 {
		return nil, fmt.Errorf("list users: %w: limit %d out of range 1-10000", ErrBadFilter, limit)
	}
	if !utf8.ValidString(after) {
		return nil, fmt.Errorf("list users: %w: %q is not UTF-8 text", ErrBadAfter, after)
	}
	var rows []userDetailRow
	err := s.withRetry(ctx, "list users", func() error {
		rows = rows[:0]
		return s.db.SelectContext(ctx, &rows, "SELECT "+userColumns+", created_at FROM users WHERE name > ? ORDER BY name LIMIT ?", after, limit)
	})
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	out := make([]UserDetail, len(rows))
	for i, r := range rows {
		out[i] = s.detail(r)
	}
	return out, nil
}

// DisableUser refuses the user from the next admission on: admission reads disabled_at under
// the user lock, and key lookups stop matching at once (the proxy's key cache may serve a
// looked-up key for up to key_cache_ttl more, and calls already admitted run to completion
// and settle). It reports whether the user was enabled before.
func (s *Store) DisableUser(ctx context.Context, userID uint64) (bool, error) {
	return s.setDisabled(ctx, userID, true)
}

// EnableUser undoes DisableUser. It reports whether the user was disabled before.
func (s *Store) EnableUser(ctx context.Context, userID uint64) (bool, error) {
	return s.setDisabled(ctx, userID, false)
}

func (s *Store) setDisabled(ctx context.Context, userID uint64, disable bool) (bool, error) {
	q := "UPDATE users SET disabled_at = NOW(6) WHERE id = ? AND disabled_at IS NULL"
	what := "disable"
	if !disable {
		q = "UPDATE users SET disabled_at = NULL WHERE id = ? AND disabled_at IS NOT NULL"
		what = "enable"
	}
	var changed int64
	err := s.withRetry(ctx, what+" user", func() error {
		res, err := s.db.ExecContext(ctx, q, userID)
		if err != nil {
			return err
		}
		changed, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s user %d: %w", what, userID, err)
	}
	if changed == 0 {
		if err := s.userExists(ctx, userID); err != nil {
			return false, fmt.Errorf("%s user %d: %w", what, userID, err)
		}
	}
	s.log.Info("user disabled state set", zap.String("action", what), zap.Uint64("user_id", userID), zap.Bool("changed", changed == 1))
	return changed == 1, nil
}

func (s *Store) userExists(ctx context.Context, userID uint64) error {
	var n int
	err := s.db.GetContext(ctx, &n, "SELECT COUNT(*) FROM users WHERE id = ?", userID)
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrUnknownUser
	}
	return nil
}

// KeyInfo is an API key as lists show it: never the key, only its first characters, and its
// id, the cursor of a listing's next page.
type KeyInfo struct {
	ID        uint64       `db:"id"`
	Prefix    string       `db:"prefix"`
	CreatedAt time.Time    `db:"created_at"`
	RevokedAt sql.NullTime `db:"revoked_at"`
}

// ListKeys lists up to limit of a user's keys, newest first: by created_at, then id, so the
// order is total and a page that starts after the key afterID (0: from the start) skips and
// repeats none. afterID must be one of the user's keys (ErrBadAfter otherwise).
func (s *Store) ListKeys(ctx context.Context, userID, afterID uint64, limit int) ([]KeyInfo, error) {
	if limit <= 0 || limit > 10_000 {
		return nil, fmt.Errorf("keys of user %d: %w: limit %d out of range 1-10000", userID, ErrBadFilter, limit)
	}
	q := "SELECT id, prefix, created_at, revoked_at FROM api_keys WHERE user_id = ?"
	args := []any{userID}
	if afterID != 0 {
		var at time.Time
		err := s.withRetry(ctx, "list keys", func() error {
			return s.db.GetContext(ctx, &at, "SELECT created_at FROM api_keys WHERE id = ? AND user_id = ?", afterID, userID)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("keys of user %d: %w: %d is no key of this user", userID, ErrBadAfter, afterID)
		}
		if err != nil {
			return nil, fmt.Errorf("keys of user %d: %w", userID, err)
		}
		q += " AND (created_at < ? OR (created_at = ? AND id < ?))"
		args = append(args, at, at, afterID)
	}
	q += " ORDER BY created_at DESC, id DESC LIMIT ?"
	args = append(args, limit)
	out := []KeyInfo{}
	err := s.withRetry(ctx, "list keys", func() error {
		out = out[:0]
		return s.db.SelectContext(ctx, &out, q, args...)
	})
	if err != nil {
		return nil, fmt.Errorf("keys of user %d: %w", userID, err)
	}
	return out, nil
}

// RevokeAPIKey is RevokeKey that tells "no such live key" (ErrKeyNotFound) apart from a
// database failure, so the admin API can answer 404 instead of 500, and that reports whose
// key it was, by the name every admin view shows (ids are the store's own). A key whose user
// row is gone (deleted by hand: there are no foreign keys) is still revoked, its user named ""
// as the runs listing names an orphan's: a user restored under that id would have it back.
func (s *Store) RevokeAPIKey(ctx context.Context, key string) (user string, err error) {
	hash := HashKey(key)
	err = s.withRetry(ctx, "revoke key", func() error {
		return s.db.GetContext(ctx, &user, `SELECT COALESCE(u.name, '') FROM api_keys k LEFT JOIN users u ON u.id = k.user_id
			WHERE k.key_hash = ? AND k.revoked_at IS NULL`, hash[:])
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("revoke key: %w", ErrKeyNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("revoke key: %w", err)
	}
	if err := s.RevokeKey(ctx, key); err != nil {
		// Revoked concurrently between the two statements: the key is dead either way.
		if s.keyRevoked(ctx, hash) {
			return user, nil
		}
		return "", err
	}
	s.log.Info("key revoked", zap.String("user", user), zap.String("prefix", ShownPrefix(key)))
	return user, nil
}

func (s *Store) keyRevoked(ctx context.Context, hash [32]byte) bool {
	var n int
	err := s.db.GetContext(ctx, &n, "SELECT COUNT(*) FROM api_keys WHERE key_hash = ? AND revoked_at IS NOT NULL", hash[:])
	return err == nil && n == 1
}

// RevokeKeysByPrefix revokes a user's live keys that start with prefix (as ListKeys shows
// them), for the operator who no longer has the key itself. It returns how many it revoked;
// prefixes are not unique, so it is scoped to one user and needs the whole stored prefix.
//
// It first reads which keys are live, then revokes those: the revocation is retried when its
// reply is lost, and a retry that finds them already revoked (by its own first attempt, or a
// concurrent revocation: they are dead either way) still answers the keys this request found
// live, where counting the rows the retry changed answered "no live key" (ErrKeyNotFound).
func (s *Store) RevokeKeysByPrefix(ctx context.Context, userID uint64, prefix string) (int64, error) {
	// The stored prefix is compared whole: part of it matched nothing and was answered "no
	// live key", which read as a key already revoked while it stayed live.
	if !strings.HasPrefix(prefix, KeyPrefix) || len(prefix) != KeyPrefixLen {
		return 0, fmt.Errorf("revoke keys of user %d: %w: prefix %q: want the whole prefix that key list shows, %d characters starting %s",
			userID, ErrBadFilter, prefix, KeyPrefixLen, KeyPrefix)
	}
	var live [][]byte
	err := s.withRetry(ctx, "revoke keys by prefix", func() error {
		live = live[:0]
		return s.db.SelectContext(ctx, &live, "SELECT key_hash FROM api_keys WHERE user_id = ? AND prefix = ? AND revoked_at IS NULL", userID, prefix)
	})
	if err != nil {
		return 0, fmt.Errorf("revoke keys of user %d: find live keys: %w", userID, err)
	}
	if len(live) == 0 {
		return 0, fmt.Errorf("revoke keys of user %d: prefix %q: %w", userID, prefix, ErrKeyNotFound)
	}
	q, args, err := sqlx.In("UPDATE api_keys SET revoked_at = NOW(6) WHERE key_hash IN (?) AND revoked_at IS NULL", live)
	if err != nil {
		return 0, fmt.Errorf("revoke keys of user %d: %w", userID, err)
	}
	err = s.withRetry(ctx, "revoke keys by prefix", func() error {
		_, err := s.db.ExecContext(ctx, q, args...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("revoke keys of user %d: %w", userID, err)
	}
	n := int64(len(live))
	s.log.Info("keys revoked", zap.Uint64("user_id", userID), zap.String("prefix", prefix), zap.Int64("count", n))
	return n, nil
}

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
	Limit int // 1-10000
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
	if f.Limit <= 0 || f.Limit > 10_000 {
		return nil, fmt.Errorf("list runs: %w: limit %d out of range 1-10000", ErrBadFilter, f.Limit)
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

// UsageRow is one line of the usage report: one user, one UTC day of settlement, one model.
type UsageRow struct {
	UserID      uint64 `db:"user_id"`
	UserName    string `db:"user_name"`
	Day         string `db:"day"` // YYYY-MM-DD, the UTC day the runs settled (the day ledger's day)
	Model       string `db:"model"`
	Runs        int64  `db:"runs"`         // settled runs, releases at 0 included
	ChargedRuns int64  `db:"charged_runs"` // of those, runs that charged anything (the ledger's run_count)
	// EstimatedRuns: of Runs, those charged an estimate for at least one call (no usage report
	// from the provider): their tokens are the gateway's count, not what the provider invoices.
	EstimatedRuns int64 `db:"estimated_runs"`
	Calls         int64 `db:"calls"`
	InTok         int64 `db:"in_tok"`
	CacheReadTok  int64 `db:"cache_read_tok"`
	CacheWriteTok int64 `db:"cache_write_tok"`
	OutTok        int64 `db:"out_tok"`
	// CacheWrite1hTok, AudioInTok and AudioOutTok are the parts of CacheWriteTok, InTok and
	// OutTok that were one-hour cache writes, audio input and audio output, which a provider's
	// invoice lists apart. Runs settled before migration 014 count 0 in them.
	CacheWrite1hTok    int64 `db:"cache_write_1h_tok"`
	AudioInTok         int64 `db:"audio_in_tok"`
	AudioOutTok        int64 `db:"audio_out_tok"`
	CostMicro          int64 `db:"cost_micro"`
	ChargedMicro       int64 `db:"charged_micro"`
	AllowancePartMicro int64 `db:"allowance_part_micro"`
	PrepaidPartMicro   int64 `db:"prepaid_part_micro"`
}

// add adds r's counts and amounts to u's.
func (u *UsageRow) add(r UsageRow) {
	u.Runs += r.Runs
	u.ChargedRuns += r.ChargedRuns
	u.EstimatedRuns += r.EstimatedRuns
	u.Calls += r.Calls
	u.InTok += r.InTok
	u.CacheReadTok += r.CacheReadTok
	u.CacheWriteTok += r.CacheWriteTok
	u.OutTok += r.OutTok
	u.CacheWrite1hTok += r.CacheWrite1hTok
	u.AudioInTok += r.AudioInTok
	u.AudioOutTok += r.AudioOutTok
	u.CostMicro += r.CostMicro
	u.ChargedMicro += r.ChargedMicro
	u.AllowancePartMicro += r.AllowancePartMicro
	u.PrepaidPartMicro += r.PrepaidPartMicro
}

// UsageReport is settled usage over a range of UTC days, by user, day and model.
type UsageReport struct {
	From, To string // inclusive, YYYY-MM-DD
	Rows     []UsageRow
	Totals   UsageRow // sums over Rows; user, day and model empty
	// LedgerMicro and LedgerRuns are the day ledger (usage_days) over the same users and days.
	// They equal Totals.ChargedMicro and Totals.ChargedRuns; a report that shows otherwise
	// has found a bug, which is why it carries both.
	LedgerMicro int64
	LedgerRuns  int64
}

// maxReportDays bounds a report's range, so one request cannot scan the table's whole life.
const maxReportDays = 366

// maxReportRows bounds the rows (user × day × model) one report holds in memory, about 30 MB:
// a busy range is asked for user by user, or in shorter ranges. A variable for tests.
var maxReportRows = 100_000

// Today is the database's UTC day: the day a charge settled now lands on in the ledger, which
// a usage report asked without dates covers. The gateway's clock may be on the other side of
// midnight from it.
func (s *Store) Today(ctx context.Context) (time.Time, error) {
	var today time.Time
	if err := s.db.GetContext(ctx, &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		return time.Time{}, fmt.Errorf("today: %w", err)
	}
	return today.UTC(), nil
}

// Usage reports settled runs between the UTC days from and to, inclusive, for one user
// (userID != 0) or all. Runs are attributed to the day they settled, as the day ledger is.
func (s *Store) Usage(ctx context.Context, from, to time.Time, userID uint64) (UsageReport, error) {
	from = day(from)
	to = day(to)
	if to.Before(from) {
		return UsageReport{}, fmt.Errorf("usage report: %w: to %s before from %s", ErrBadFilter, to.Format(time.DateOnly), from.Format(time.DateOnly))
	}
	if days := int(to.Sub(from)/(24*time.Hour)) + 1; days > maxReportDays {
		return UsageReport{}, fmt.Errorf("usage report: %w: %d days, at most %d", ErrBadFilter, days, maxReportDays)
	}
	if !storableTime(from) || !storableTime(to.AddDate(0, 0, 1)) {
		return UsageReport{}, fmt.Errorf("usage report: %w: days must lie between 0001-01-01 and 9999-12-30", ErrBadFilter)
	}
	rep := UsageReport{From: from.Format(time.DateOnly), To: to.Format(time.DateOnly), Rows: []UsageRow{}}
	end := to.AddDate(0, 0, 1)
	userCond, args := "", []any{from, end}
	if userID != 0 {
		userCond, args = " AND h.user_id = ?", append(args, userID)
	}
	// Settled runs still kept, summed per user, day and model, and the sums of those pruned
	// (PruneSettled), which are kept on the same grouping: a day reads the same either way.
	q := `SELECT h.user_id, u.name AS user_name, h.day, h.model,
		       SUM(h.runs) AS runs, SUM(h.charged_runs) AS charged_runs, SUM(h.estimated_runs) AS estimated_runs, SUM(h.calls) AS calls,
		       SUM(h.in_tok) AS in_tok, SUM(h.cache_read_tok) AS cache_read_tok,
		       SUM(h.cache_write_tok) AS cache_write_tok, SUM(h.out_tok) AS out_tok,
		       SUM(h.cache_write_1h_tok) AS cache_write_1h_tok, SUM(h.audio_in_tok) AS audio_in_tok,
		       SUM(h.audio_out_tok) AS audio_out_tok,
		       SUM(h.cost_micro) AS cost_micro, SUM(h.charged_micro) AS charged_micro,
		       SUM(h.allowance_part_micro) AS allowance_part_micro, SUM(h.prepaid_part_micro) AS prepaid_part_micro
		FROM (SELECT h.user_id, DATE_FORMAT(h.settled_at, '%Y-%m-%d') AS day, h.model,
		             COUNT(*) AS runs, SUM(h.charged_micro > 0) AS charged_runs, SUM(h.estimated) AS estimated_runs, SUM(h.calls) AS calls,
		             SUM(h.in_tok) AS in_tok, SUM(h.cache_read_tok) AS cache_read_tok,
		             SUM(h.cache_write_tok) AS cache_write_tok, SUM(h.out_tok) AS out_tok,
		             SUM(h.cache_write_1h_tok) AS cache_write_1h_tok, SUM(h.audio_in_tok) AS audio_in_tok,
		             SUM(h.audio_out_tok) AS audio_out_tok,
		             SUM(h.cost_micro) AS cost_micro, SUM(h.charged_micro) AS charged_micro,
		             SUM(h.allowance_part_micro) AS allowance_part_micro, SUM(h.prepaid_part_micro) AS prepaid_part_micro
		      FROM run_holds h
		      WHERE h.state = 'settled' AND h.settled_at >= ? AND h.settled_at < ?` + userCond + `
		      GROUP BY h.user_id, DATE_FORMAT(h.settled_at, '%Y-%m-%d'), h.model
		      UNION ALL
		      SELECT h.user_id, DATE_FORMAT(h.day, '%Y-%m-%d'), h.model, h.runs, h.charged_runs, h.estimated_runs, h.calls, h.in_tok,
		             h.cache_read_tok, h.cache_write_tok, h.out_tok, h.cache_write_1h_tok, h.audio_in_tok, h.audio_out_tok,
		             h.cost_micro, h.charged_micro,
		             h.allowance_part_micro, h.prepaid_part_micro
		      FROM pruned_runs h WHERE h.day >= ? AND h.day < ?` + userCond + `) h
		JOIN users u ON u.id = h.user_id
		GROUP BY h.user_id, u.name, h.day, h.model
		ORDER BY u.name, h.day, h.model
		LIMIT ` + strconv.Itoa(maxReportRows+1)
	rowArgs := append(append([]any{}, args...), args...)
	ledgerQ := `SELECT COALESCE(SUM(used_micro), 0) AS used, COALESCE(SUM(run_count), 0) AS runs
		FROM usage_days h WHERE h.day >= ? AND h.day < ?` + userCond
	var ledger struct {
		Used int64 `db:"used"`
		Runs int64 `db:"runs"`
	}
	// One read-only REPEATABLE READ transaction, so the rows and the ledger are the same
	// snapshot (the sessions' READ COMMITTED would give each statement its own).
	err := s.withRetry(ctx, "usage report", func() error {
		tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		rep.Rows = rep.Rows[:0]
		if err := tx.SelectContext(ctx, &rep.Rows, q, rowArgs...); err != nil {
			return err
		}
		return tx.GetContext(ctx, &ledger, ledgerQ, args...)
	})
	if err != nil {
		return UsageReport{}, fmt.Errorf("usage report %s..%s: %w", rep.From, rep.To, err)
	}
	if len(rep.Rows) > maxReportRows {
		return UsageReport{}, fmt.Errorf("usage report %s..%s: %w: more than %d rows; name a user or shorten the range",
			rep.From, rep.To, ErrBadFilter, maxReportRows)
	}
	for _, r := range rep.Rows {
		rep.Totals.add(r)
	}
	rep.LedgerMicro, rep.LedgerRuns = ledger.Used, ledger.Runs
	if rep.LedgerMicro != rep.Totals.ChargedMicro || rep.LedgerRuns != rep.Totals.ChargedRuns {
		s.log.Error("usage report disagrees with the day ledger", zap.String("from", rep.From), zap.String("to", rep.To),
			zap.Uint64("user_id", userID), zap.Int64("ledger_micro", rep.LedgerMicro), zap.Int64("charged_micro", rep.Totals.ChargedMicro),
			zap.Int64("ledger_runs", rep.LedgerRuns), zap.Int64("charged_runs", rep.Totals.ChargedRuns))
	}
	return rep, nil
}

// day truncates t to its UTC day.
func day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// storableTime reports whether t, in UTC, is a DATETIME the database and its driver take
// (years 1-9999): an operator's typo in a filter is a 400, not a failed query.
func storableTime(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}
