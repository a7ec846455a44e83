package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
)

// This file and keys_admin.go, run_list.go and usage_report.go are the operator's side of the
// store: what the admin API and the gateway's subcommands need beyond the money paths (here:
// plans and users). Nothing here moves money except through Grant; the statements that change
// a user touch only that user's row, one statement each, so they need no place in the lock
// order beyond the users row they update.

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
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !sameUserName(r.Name, name)) {
		return UserDetail{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
	}
	if err != nil {
		return UserDetail{}, fmt.Errorf("user %q: %w", name, err)
	}
	return s.detail(r), nil
}

// sameUserName reports whether asked names the user stored as name: the same bytes but for
// the case of ASCII letters. The column's collation, which found the row, also folds accents
// and ignores trailing spaces (and in some collations more), so "josé" or "jose " found the
// user "jose": a name the name rule never lets a user have reached another user, and a grant
// typed for one customer credited another.
func sameUserName(name, asked string) bool {
	if len(name) != len(asked) {
		return false
	}
	for i := 0; i < len(name); i++ {
		a, b := name[i], asked[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// ListUsers lists users by name, at most limit of them, starting after the name after
// (empty: from the start) so a long list can be paged. The order is total: names are unique
// under the column's collation (uq_users_name), the one ORDER BY and > compare by, so no user
// is skipped or listed twice across pages; after need not be a user's name. It must be UTF-8
// text (ErrBadAfter): MariaDB compares other bytes without an error and lists nothing, a last
// page that hid every user after it.
func (s *Store) ListUsers(ctx context.Context, after string, limit int) ([]UserDetail, error) {
	if limit <= 0 || limit > maxListRows {
		return nil, fmt.Errorf("list users: %w: limit %d out of range 1-%d", ErrBadFilter, limit, maxListRows)
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

// EnableUser undoes DisableUser. It reports whether the user was disabled before. A proxy that
// refused one of the user's keys in the last key_cache_ttl keeps refusing it until then.
func (s *Store) EnableUser(ctx context.Context, userID uint64) (bool, error) {
	return s.setDisabled(ctx, userID, false)
}

// setDisabled runs the conditional update, whose RowsAffected says whether this request
// changed the user. The update is retried when its reply is lost, and a retry after its own
// first attempt applied it changes nothing: so the state is read first, and a request that
// found the user in the other state and lost a reply on the way answers changed (the user was
// then changed by it, or by a concurrent request that found it the same way: changed either
// way), where counting the retry's rows answered "was so already".
func (s *Store) setDisabled(ctx context.Context, userID uint64, disable bool) (bool, error) {
	q := "UPDATE users SET disabled_at = NOW(6) WHERE id = ? AND disabled_at IS NULL"
	what := "disable"
	if !disable {
		q = "UPDATE users SET disabled_at = NULL WHERE id = ? AND disabled_at IS NOT NULL"
		what = "enable"
	}
	was, err := s.userDisabled(ctx, userID)
	if err != nil {
		return false, fmt.Errorf("%s user %d: %w", what, userID, err)
	}
	var changed int64
	var lost bool // an attempt failed unreachable: it may have applied the update
	if was != disable {
		// A refusal for want of room is waited out too (withRoomRetry): disabled_at set grows
		// the user's row, which may split its page on a full disk.
		err = s.withRoomRetry(ctx, what+" user", nil, func() error {
			res, err := s.db.ExecContext(ctx, q, userID)
			if err != nil {
				// A refusal read_only, or for want of room, did not run: it applied nothing.
				lost = lost || (isUnavailable(err) && !isReadOnly(err))
				return err
			}
			changed, err = res.RowsAffected()
			return err
		})
	}
	if err != nil {
		return false, fmt.Errorf("%s user %d: %w", what, userID, err)
	}
	done := changed == 1 || lost
	s.log.Info("user disabled state set", zap.String("action", what), zap.Uint64("user_id", userID), zap.Bool("changed", done))
	return done, nil
}

// userDisabled reads whether a user is disabled: ErrUnknownUser when there is none.
func (s *Store) userDisabled(ctx context.Context, userID uint64) (bool, error) {
	var disabled bool
	err := s.withRetry(ctx, "read user", func() error {
		return s.db.GetContext(ctx, &disabled, "SELECT disabled_at IS NOT NULL FROM users WHERE id = ?", userID)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, ErrUnknownUser
	}
	return disabled, err
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
