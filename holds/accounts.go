package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jmoiron/sqlx"
)

// User is an account as the proxy sees it.
type User struct {
	ID       uint64
	Name     string
	Plan     string
	Disabled bool
}

// userNamePattern is what a user's name may be: names travel in URL paths (the admin API's
// /users/{name}), CSV cells and logs, so they are kept to characters that need no escaping
// anywhere. The store enforces it, so the admin API and the gateway's subcommands cannot
// drift apart on it.
var userNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$`)

// UserNameRule says in words what validUserName accepts, for the answers that refuse a name.
const UserNameRule = "name must be 1-128 characters of A-Z a-z 0-9 . _ @ + - and start with a letter or digit"

// ErrInvalidName refuses a new user's name that validUserName does not accept.
var ErrInvalidName = errors.New(UserNameRule)

// validUserName reports whether name may be a new user's name.
func validUserName(name string) bool { return userNamePattern.MatchString(name) }

// CreateUser adds an account on a plan ("": the store's default plan). A name validUserName
// refuses is ErrInvalidName, an unknown plan ErrUnknownPlan, a name taken ErrUserExists.
//
// A refusal read_only (a failover's switch, maintenance) or for want of room on the
// database's disk (1114, 1021) is tried again until ctx ends (execUntilWritable), as a grant
// is: the refused INSERT ran nothing. A failure whose INSERT
// may have landed (its reply lost) is not: sent again, it would answer ErrUserExists for the
// user it made.
func (s *Store) CreateUser(ctx context.Context, name, plan string) (User, error) {
	if !validUserName(name) {
		return User{}, fmt.Errorf("create user %q: %w", name, ErrInvalidName)
	}
	if plan == "" {
		plan = s.defaultPlan
	}
	if _, ok := s.plans[plan]; !ok {
		return User{}, fmt.Errorf("create user %q: %w %q", name, ErrUnknownPlan, plan)
	}
	for try := 1; ; try++ {
		u, err := s.insertUser(ctx, name, plan)
		if !isDuplicate(err) {
			return u, err
		}
		// Names are unique under the column's collation, which ignores case: the refusal names
		// the user that holds the name ("Alice" for alice), whom no listing shows as alice.
		taken := ""
		if qerr := s.db.GetContext(ctx, &taken, "SELECT name FROM users WHERE name = ?", name); qerr == nil {
			return User{}, fmt.Errorf("create user %q: %w", name, &UserExistsError{Name: name, Taken: taken})
		} else if !errors.Is(qerr, sql.ErrNoRows) {
			return User{}, fmt.Errorf("create user %q: %w", name, &UserExistsError{Name: name, Taken: name})
		}
		// The name is free: the id was taken by a user created at the same moment. The
		// refused INSERT wrote nothing; the next reads the new highest id.
		if try == maxUserIDTries {
			return User{}, fmt.Errorf("create user %q: %d ids taken by users created at once: %w", name, try, err)
		}
	}
}

// maxUserIDTries bounds CreateUser's tries when another user created at once took its id.
const maxUserIDTries = 16

// insertUserQuery gives a new user an id above every id the table holds and at least the
// database clock in microseconds since the epoch (GREATEST with the highest id + 1, read just
// before). The clock is what keeps an id from being given twice across a restore: Redis keeps
// what it holds of a user under the user's id — its named runs' tallies and Idempotency-Key
// answers under run ids hashed from it, its kept answers, its Responses and spoken answers — for
// up to tally_ttl, and a database restored from a backup has forgotten the users created since.
// With AUTO_INCREMENT's next id the first user created after the restore took the id of the
// first one lost, and with it that user's Redis state: a named run of the same name opened on
// the lost user's tally and settled it on the new user's bill. Microseconds stay below 2^53
// (exact in JSON) until the year 2255.
const insertUserQuery = `INSERT INTO users (id, name, plan)
  VALUES (GREATEST(?, CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS UNSIGNED)), ?, ?)`

// insertUser makes one try at the new user's row. A duplicate key is returned as it is: the
// name taken, or the id (CreateUser tells which).
func (s *Store) insertUser(ctx context.Context, name, plan string) (User, error) {
	var highest uint64
	if err := s.db.GetContext(ctx, &highest, "SELECT COALESCE(MAX(id), 0) FROM users"); err != nil {
		return User{}, fmt.Errorf("create user %q: read the highest id: %w", name, err)
	}
	res, err := s.execUntilWritable(ctx, "create user", nil, insertUserQuery, highest+1, name, plan)
	if isDuplicate(err) {
		return User{}, err
	}
	if err != nil {
		return User{}, fmt.Errorf("create user %q: %w", name, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return User{}, fmt.Errorf("create user %q: %w", name, err)
	}
	return User{ID: uint64(id), Name: name, Plan: plan}, nil
}

// ErrUserExists refuses a second user of one name.
var ErrUserExists = errors.New("user exists")

// UserExistsError is ErrUserExists for a new user's Name, with the name of the user that has
// it (Taken): names are compared without regard to case, so it may be spelt otherwise.
type UserExistsError struct{ Name, Taken string }

func (e *UserExistsError) Error() string {
	if e.Taken == e.Name {
		return ErrUserExists.Error()
	}
	return fmt.Sprintf("%v as %q (names are compared without regard to case)", ErrUserExists, e.Taken)
}

func (e *UserExistsError) Unwrap() error { return ErrUserExists }

// UserByName finds an account. Its errors name the user, so callers return them as they are
// (ErrUnknownUser when there is none).
func (s *Store) UserByName(ctx context.Context, name string) (User, error) {
	var u userRow
	err := s.db.GetContext(ctx, &u, "SELECT "+userColumns+" FROM users WHERE name = ?", name)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !sameUserName(u.Name, name)) {
		return User{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
	}
	if err != nil {
		return User{}, fmt.Errorf("user %q: %w", name, err)
	}
	return User{ID: u.ID, Name: u.Name, Plan: u.Plan, Disabled: u.DisabledAt.Valid}, nil
}

// UsersByPlan counts the users on each plan name their rows carry, for the check at start that
// every such plan is configured (one scan of users). Names are told apart byte by byte, as the
// plans are looked up: users.plan compares without case, and grouped by it the users of "Guest"
// were counted under "guest".
func (s *Store) UsersByPlan(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		Plan  string `db:"plan"`
		Users int64  `db:"users"`
	}
	if err := s.db.SelectContext(ctx, &rows,
		"SELECT CAST(plan AS BINARY) AS plan, COUNT(*) AS users FROM users GROUP BY CAST(plan AS BINARY)"); err != nil {
		return nil, fmt.Errorf("users by plan: %w", err)
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Plan] = r.Users
	}
	return out, nil
}

// Balance is what GET /v1/credits shows, in micro-USD.
type Balance struct {
	// Plan is the user's plan as the same read found it, the plan the figures are of: the
	// proxy's key cache keeps the plan a key was looked up with, for up to key_cache_ttl
	// after an operator moves the user to another plan. A plan no longer configured is the
	// default plan, whose terms the figures are.
	Plan           string
	AllowanceMicro int64
	UsedTodayMicro int64
	// HeldMicro is what the user's live holds count against the balance: each its hold, or
	// what its run's calls have used when that is more (see owedMicro).
	HeldMicro int64
	// SpentInRunsMicro is what the calls of the user's unsettled runs have used so far, as
	// their rows record them, at what their settlements will charge: a part of HeldMicro, not
	// yet in UsedTodayMicro.
	SpentInRunsMicro int64
	PrepaidMicro     int64
	AvailableMicro   int64
	InFlight         int
	// Day is the database's UTC date that UsedTodayMicro belongs to: the ledger's day, not
	// the caller's clock, which may be on the other side of midnight.
	Day time.Time
}

// Balance reads a user's balance. It takes no lock: a view may be a moment old, admission
// never is.
func (s *Store) Balance(ctx context.Context, userID uint64) (Balance, error) {
	var b Balance
	err := s.withRetry(ctx, "balance", func() error {
		tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		b, err = s.balanceTx(ctx, tx, userID)
		return err
	})
	if err != nil {
		return Balance{}, fmt.Errorf("balance of user %d: %w", userID, err)
	}
	return b, nil
}

// balanceTx reads the user, its live holds and today's ledger in one statement. Under READ
// COMMITTED each statement reads its own snapshot: read in two, a settlement committing
// between them was seen half done (prepaid not yet charged, its hold already gone), and the
// balance overstated what the user could spend.
func (s *Store) balanceTx(ctx context.Context, tx *sqlx.Tx, userID uint64) (Balance, error) {
	var row struct {
		userRow
		InFlight  int       `db:"in_flight"`
		Held      int64     `db:"held"`
		Spent     int64     `db:"spent"`
		UsedToday int64     `db:"used_today"`
		Day       time.Time `db:"day"`
	}
	err := tx.GetContext(ctx, &row, `
		SELECT `+userColumns+`, live.in_flight, live.held, live.spent,
		       COALESCE((SELECT used_micro FROM usage_days WHERE user_id = users.id AND day = UTC_DATE()), 0) AS used_today,
		       UTC_DATE() AS day
		FROM users CROSS JOIN (
		       SELECT COALESCE(SUM(expires_at > NOW(6)), 0) AS in_flight, COALESCE(SUM(`+owedSQL+`), 0) AS held,
		              COALESCE(SUM(`+spentSQL+`), 0) AS spent FROM run_holds
		        WHERE user_id = ? AND state IN ('queued', 'running')) AS live
		WHERE users.id = ?`, userID, userID)
	if errors.Is(err, sql.ErrNoRows) {
		return Balance{}, ErrUnknownUser
	}
	if err != nil {
		return Balance{}, err
	}
	plan := s.plan(row.userRow)
	return Balance{Plan: s.planName(row.userRow), AllowanceMicro: plan.AllowanceMicro, UsedTodayMicro: row.UsedToday, HeldMicro: row.Held,
		SpentInRunsMicro: row.Spent, PrepaidMicro: row.PrepaidMicro, InFlight: row.InFlight, Day: row.Day,
		AvailableMicro: Available(plan.AllowanceMicro, row.UsedToday, row.PrepaidMicro, row.Held)}, nil
}

// Override is a change to one per-user override of a plan's figure.
type Override[T any] struct {
	Set   bool // set it to Value
	Clear bool // drop it: the plan's figure applies again
	Value T
}

// SetTo is an Override that sets v.
func SetTo[T any](v T) Override[T] { return Override[T]{Set: true, Value: v} }

// change is the override's state for ChangeUser's statement: 0 leave, 1 set, 2 clear.
func (o Override[T]) change() int {
	switch {
	case o.Set:
		return 1
	case o.Clear:
		return 2
	}
	return 0
}

// UserChange is what ChangeUser changes; the zero value changes nothing.
type UserChange struct {
	Plan        string // "" leaves the plan as it is
	Allowance   Override[int64]
	MaxInFlight Override[int]
	DiscountBP  Override[int]
}

// ChangeUser changes a user's plan and overrides in one statement: all of them or none.
// Admission reads them under the user lock, so a change applies from the next admission;
// holds already taken keep the terms (hold, cap, discount) they were admitted with.
//
// An override set where there was none, or a longer plan name, grows the user's row, which
// may split its page: a refusal for want of room on the database's disk (1114, 1021) is tried
// again until ctx ends, as a read_only one is (withRoomRetry); the refused statement ran
// nothing.
func (s *Store) ChangeUser(ctx context.Context, userID uint64, c UserChange) error {
	if c.Plan != "" && !s.HasPlan(c.Plan) {
		return fmt.Errorf("change user %d: %w %q", userID, ErrUnknownPlan, c.Plan)
	}
	var changed int64
	err := s.withRoomRetry(ctx, "change user", nil, func() error {
		res, err := s.db.ExecContext(ctx, `UPDATE users SET
			plan = IF(? = '', plan, ?),
			allowance_micro = CASE ? WHEN 1 THEN ? WHEN 2 THEN NULL ELSE allowance_micro END,
			max_in_flight = CASE ? WHEN 1 THEN ? WHEN 2 THEN NULL ELSE max_in_flight END,
			discount_bp = CASE ? WHEN 1 THEN ? WHEN 2 THEN NULL ELSE discount_bp END
			WHERE id = ?`,
			c.Plan, c.Plan, c.Allowance.change(), c.Allowance.Value, c.MaxInFlight.change(), c.MaxInFlight.Value,
			c.DiscountBP.change(), c.DiscountBP.Value, userID)
		if err != nil {
			return err
		}
		changed, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("change user %d: %w", userID, err)
	}
	if changed == 0 {
		// Also when nothing differed: tell that apart from no such user.
		if err := s.userExists(ctx, userID); err != nil {
			return fmt.Errorf("change user %d: %w", userID, err)
		}
	}
	return nil
}

// SetUserLimits sets per-user overrides; nil leaves a field as it is (ChangeUser can also
// clear one).
func (s *Store) SetUserLimits(ctx context.Context, userID uint64, allowanceMicro *int64, maxInFlight *int, discountBP *int) error {
	var c UserChange
	if allowanceMicro != nil {
		c.Allowance = SetTo(*allowanceMicro)
	}
	if maxInFlight != nil {
		c.MaxInFlight = SetTo(*maxInFlight)
	}
	if discountBP != nil {
		c.DiscountBP = SetTo(*discountBP)
	}
	return s.ChangeUser(ctx, userID, c)
}
