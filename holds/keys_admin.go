package holds

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// The operator's view of API keys: listings that never show a key, and revocation.

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
	if limit <= 0 || limit > maxListRows {
		return nil, fmt.Errorf("keys of user %d: %w: limit %d out of range 1-%d", userID, ErrBadFilter, limit, maxListRows)
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
		return 0, fmt.Errorf("revoke keys of user %d: %w: %s: want the whole prefix that key list shows, %d characters starting %s",
			userID, ErrBadFilter, shownBadPrefix(prefix), KeyPrefixLen, KeyPrefix)
	}
	var live [][]byte
	err := s.withRetry(ctx, "revoke keys by prefix", func() error {
		live = live[:0]
		// Compared as bytes: a key is case-sensitive, the column's collation is not, and
		// another key whose prefix differs only in case must stay live.
		return s.db.SelectContext(ctx, &live,
			"SELECT key_hash FROM api_keys WHERE user_id = ? AND CAST(prefix AS BINARY) = ? AND revoked_at IS NULL", userID, prefix)
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
	// The revocation grows each key's row, which may split its page: a full disk's refusal is
	// waited out too (withRoomRetry), and a retry after one finds the keys still live.
	err = s.withRoomRetry(ctx, "revoke keys by prefix", nil, func() error {
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

// shownBadPrefix is a refused prefix fit for an error message, which is answered and logged:
// one longer than a stored prefix is most often a whole key pasted in its place, still live
// since nothing was revoked, so only its first KeyPrefixLen characters are quoted.
func shownBadPrefix(prefix string) string {
	if len(prefix) <= KeyPrefixLen {
		return fmt.Sprintf("prefix %q", prefix)
	}
	return fmt.Sprintf("prefix %q... of %d characters (not shown whole; to revoke a whole key, give it as the key, not as a prefix)",
		ShownPrefix(prefix), len(prefix))
}
