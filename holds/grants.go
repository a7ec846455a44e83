package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/token"
)

// Grant is one append-only movement of prepaid credits: a top-up, a bonus, or (negative) a
// refund or correction. BalanceAfterMicro is users.prepaid_micro right after it, so the
// grants of a user read as a statement; settlements spend prepaid between grants, so two
// consecutive rows need not differ by exactly the later amount.
type Grant struct {
	ID                uint64    `db:"id" json:"id"`
	UserID            uint64    `db:"user_id" json:"-"`
	AmountMicro       int64     `db:"amount_micro" json:"-"`
	BalanceAfterMicro int64     `db:"balance_after_micro" json:"-"`
	IdempotencyKey    string    `db:"idempotency_key" json:"idempotency_key"`
	Reason            string    `db:"reason" json:"reason"`
	CreatedAt         time.Time `db:"created_at" json:"created_at"`
	// AttemptToken is the token of the Grant call that inserted it (see Grant).
	AttemptToken sql.NullString `db:"attempt_token" json:"-"`
}

const grantColumns = "id, user_id, amount_micro, balance_after_micro, idempotency_key, reason, created_at, attempt_token"

// GrantRequest asks for a grant. IdempotencyKey is required: it is what turns a payment
// webhook delivered ten times into one credit. Keys are global, not per user, so a payment
// provider's event id can be used as it comes.
type GrantRequest struct {
	UserID         uint64
	AmountMicro    int64
	IdempotencyKey string
	Reason         string
}

// Limits of a grant request, matching the grants table.
const (
	maxGrantKeyLen    = 128
	maxGrantReasonLen = 255
)

// Refusals of a grant.
var (
	// ErrGrantInvalid is a request that can never succeed (zero amount, missing key, ...).
	ErrGrantInvalid = errors.New("invalid grant")
	// ErrGrantBelowZero refuses a negative grant that would take prepaid credits below zero.
	// Refunds give back what was bought, never more than what is left after what calls in
	// flight hold: a refund creates no debt of its own. A call in flight may still end above
	// its hold (up to its cap), and that overdraft, bounded as any balance's, can then show as
	// debt; refusing every refund while a call runs would be worse.
	ErrGrantBelowZero = errors.New("grant would take prepaid credits below zero")
	// ErrGrantKeyReused is an idempotency key already used for a different user or amount:
	// answering with the old grant would hide a bug in the caller.
	ErrGrantKeyReused = errors.New("idempotency key already used for a different grant")
)

// GrantBelowZeroError is ErrGrantBelowZero with the figures behind it, in micro-USD, so that
// the admin API and the CLI word them in credits, the unit the operator asked in: a refusal
// reading "grant -500000" for a refund of 500 credits looked like a refund of half a million.
type GrantBelowZeroError struct {
	AmountMicro  int64 // the refused grant (negative)
	PrepaidMicro int64 // the user's prepaid credits before it
	// HeldMicro is what calls in flight hold beyond today's allowance when they are the reason
	// (the refund fits the prepaid credits but not what those calls may still take), else 0.
	HeldMicro int64
}

func (e *GrantBelowZeroError) Error() string {
	if e.HeldMicro > 0 {
		return fmt.Sprintf("%v: prepaid %d micro-USD of which calls in flight hold %d beyond today's allowance, grant %d micro-USD",
			ErrGrantBelowZero, e.PrepaidMicro, e.HeldMicro, e.AmountMicro)
	}
	return fmt.Sprintf("%v: prepaid %d micro-USD, grant %d micro-USD", ErrGrantBelowZero, e.PrepaidMicro, e.AmountMicro)
}

// Unwrap makes errors.Is(err, ErrGrantBelowZero) hold.
func (e *GrantBelowZeroError) Unwrap() error { return ErrGrantBelowZero }

// Grant credits (or, negative, debits) a user's prepaid credits, once per idempotency key.
// It returns the grant and whether this call created it; a repeat of an earlier request
// returns the original grant with created=false, whatever happened to the balance since.
//
// The transaction follows the global lock order: the user's row first, so that two
// deliveries of one webhook queue on that lock and the second, once it has the lock, finds
// the first's committed grant by key (its consistent snapshot starts after the lock). The
// unique key is the last line of defence for a key first used for another user, whose
// transaction holds a different lock: its duplicate-key error is answered like a repeat.
//
// The insert carries a token this call keeps across its retries: when the reply to its COMMIT
// is lost and the retry finds the grant by its key, the token shows it is this call's own
// (created), not an earlier delivery's.
//
// The grant's row is new: on a full disk MariaDB refuses it (1114, 1021), the transaction
// rolled back with nothing of it committed, and it is tried again until ctx ends, as a
// read_only refusal is (withRoomRetry), where it answered the payment's webhook 500 at once.
func (s *Store) Grant(ctx context.Context, req GrantRequest) (Grant, bool, error) {
	if err := validateGrant(req); err != nil {
		return Grant{}, false, err
	}
	attempt := token.New()
	var (
		g       Grant
		created bool
	)
	err := s.withRoomRetry(ctx, "grant", []zap.Field{zap.String("idempotency_key", req.IdempotencyKey), zap.Uint64("user_id", req.UserID)}, func() error {
		return s.tryTx(ctx, func(tx *sqlx.Tx) error {
			var err error
			g, created, err = s.grantTx(ctx, tx, req, attempt)
			return err
		})
	})
	if errors.Is(err, errGrantRace) {
		// Another user's transaction inserted this key between our check and our insert; it
		// has committed (that is when the insert fails), so a plain read finds it.
		err = s.withRetry(ctx, "grant "+req.IdempotencyKey, func() error {
			return s.db.GetContext(ctx, &g, "SELECT "+grantColumns+" FROM grants WHERE idempotency_key = ?", req.IdempotencyKey)
		})
		if err == nil {
			created = g.AttemptToken.Valid && g.AttemptToken.String == attempt
			err = sameGrant(g, req)
		}
	}
	if err != nil {
		return Grant{}, false, fmt.Errorf("grant %q to user %d: %w", req.IdempotencyKey, req.UserID, err)
	}
	if created {
		s.log.Named(MoneyLog).Info("grant", zap.Uint64("user_id", g.UserID), zap.Uint64("grant_id", g.ID),
			zap.Int64("amount_micro", g.AmountMicro), zap.Int64("balance_after_micro", g.BalanceAfterMicro),
			zap.String("idempotency_key", g.IdempotencyKey), zap.String("reason", g.Reason))
	} else {
		s.log.Named(MoneyLog).Info("grant replayed", zap.Uint64("user_id", g.UserID), zap.Uint64("grant_id", g.ID),
			zap.String("idempotency_key", g.IdempotencyKey))
	}
	return g, created, nil
}

// errGrantRace is the duplicate key of a concurrent first use of a key by another user.
var errGrantRace = errors.New("grant key inserted concurrently")

func (s *Store) grantTx(ctx context.Context, tx *sqlx.Tx, req GrantRequest, attempt string) (Grant, bool, error) {
	u, err := lockUser(ctx, tx, req.UserID)
	if err != nil {
		return Grant{}, false, err
	}
	var g Grant
	err = tx.GetContext(ctx, &g, "SELECT "+grantColumns+" FROM grants WHERE idempotency_key = ?", req.IdempotencyKey)
	if err == nil {
		return g, g.AttemptToken.Valid && g.AttemptToken.String == attempt, sameGrant(g, req)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Grant{}, false, fmt.Errorf("look up grant key: %w", err)
	}
	after := u.PrepaidMicro + req.AmountMicro
	// A debit that comes out above the balance it was taken from has wrapped past MinInt64
	// (a huge refund to a user in debt): its true result is below zero, and computed in int64
	// it would have been credited as about MaxInt64.
	if req.AmountMicro < 0 && (after < 0 || after > u.PrepaidMicro) {
		return Grant{}, false, &GrantBelowZeroError{AmountMicro: req.AmountMicro, PrepaidMicro: u.PrepaidMicro}
	}
	if req.AmountMicro < 0 {
		// Calls in flight were admitted against this balance and settle against it: a refund
		// that leaves less than they hold would drive prepaid below zero when they do. The
		// user's row is locked, so no admission or settlement changes the holds meanwhile.
		b, err := s.balanceTx(ctx, tx, req.UserID)
		if err != nil {
			return Grant{}, false, fmt.Errorf("read balance: %w", err)
		}
		if Available(b.AllowanceMicro, b.UsedTodayMicro, after, b.HeldMicro) < 0 {
			return Grant{}, false, &GrantBelowZeroError{AmountMicro: req.AmountMicro, PrepaidMicro: u.PrepaidMicro,
				HeldMicro: b.HeldMicro - max(0, b.AllowanceMicro-b.UsedTodayMicro)}
		}
	}
	if req.AmountMicro > 0 && after < u.PrepaidMicro {
		return Grant{}, false, fmt.Errorf("%w: prepaid balance would overflow", ErrGrantInvalid)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO grants (user_id, amount_micro, balance_after_micro, idempotency_key, reason, attempt_token)
		VALUES (?, ?, ?, ?, ?, ?)`, req.UserID, req.AmountMicro, after, req.IdempotencyKey, req.Reason, attempt)
	if isDuplicate(err) {
		return Grant{}, false, errGrantRace
	}
	if err != nil {
		return Grant{}, false, fmt.Errorf("insert grant: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Grant{}, false, fmt.Errorf("insert grant: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE users SET prepaid_micro = ? WHERE id = ?", after, req.UserID); err != nil {
		return Grant{}, false, fmt.Errorf("credit prepaid: %w", err)
	}
	// created_at comes from the database clock, like every other time in the store.
	if err := tx.GetContext(ctx, &g, "SELECT "+grantColumns+" FROM grants WHERE id = ?", id); err != nil {
		return Grant{}, false, fmt.Errorf("read grant back: %w", err)
	}
	return g, true, nil
}

func validateGrant(req GrantRequest) error {
	switch {
	case req.AmountMicro == 0:
		return fmt.Errorf("%w: amount must not be zero", ErrGrantInvalid)
	case req.IdempotencyKey == "":
		return fmt.Errorf("%w: an idempotency key is required", ErrGrantInvalid)
	case len(req.IdempotencyKey) > maxGrantKeyLen:
		return fmt.Errorf("%w: idempotency key longer than %d bytes", ErrGrantInvalid, maxGrantKeyLen)
	case !utf8.ValidString(req.IdempotencyKey) || !utf8.ValidString(req.Reason):
		// The view shows them as JSON text, and a utf8mb4 column refuses the bytes.
		return fmt.Errorf("%w: idempotency key and reason must be UTF-8 text", ErrGrantInvalid)
	case len(req.Reason) > maxGrantReasonLen:
		return fmt.Errorf("%w: reason longer than %d bytes", ErrGrantInvalid, maxGrantReasonLen)
	}
	return nil
}

// sameGrant accepts a stored grant as the answer to req only if req asks for the same thing:
// the same user and amount. The reason is a note, not part of the money, so a retry that
// words it differently still gets the original grant.
func sameGrant(g Grant, req GrantRequest) error {
	if g.UserID != req.UserID || g.AmountMicro != req.AmountMicro {
		return fmt.Errorf("%w: key %q is grant %d", ErrGrantKeyReused, req.IdempotencyKey, g.ID)
	}
	return nil
}

// Grants lists up to limit of a user's grants, newest first, older than the grant afterID (0: from
// the newest): the cursor of a listing in pages. afterID must be one of the user's grants
// (ErrBadAfter otherwise): grants are never deleted, so any other id is no page's last_id, and
// paged from, it listed another walk's rows (or none) as if they followed a page. A limit
// outside 1-maxListRows is ErrBadFilter, as every listing's is (the admin API's 400, not 500).
func (s *Store) Grants(ctx context.Context, userID, afterID uint64, limit int) ([]Grant, error) {
	if limit <= 0 || limit > maxListRows {
		return nil, fmt.Errorf("grants of user %d: %w: limit %d out of range 1-%d", userID, ErrBadFilter, limit, maxListRows)
	}
	if afterID == 0 {
		afterID = math.MaxUint64
	} else {
		var one int
		err := s.withRetry(ctx, "list grants", func() error {
			return s.db.GetContext(ctx, &one, "SELECT 1 FROM grants WHERE id = ? AND user_id = ?", afterID, userID)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("grants of user %d: %w: %d is no grant of this user", userID, ErrBadAfter, afterID)
		}
		if err != nil {
			return nil, fmt.Errorf("grants of user %d: %w", userID, err)
		}
	}
	out := []Grant{}
	err := s.withRetry(ctx, "list grants", func() error {
		out = out[:0]
		return s.db.SelectContext(ctx, &out, "SELECT "+grantColumns+" FROM grants WHERE user_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
			userID, afterID, limit)
	})
	if err != nil {
		return nil, fmt.Errorf("grants of user %d: %w", userID, err)
	}
	return out, nil
}
