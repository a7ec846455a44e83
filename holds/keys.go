package holds

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// KeyPrefix starts every API key tollgate issues, so a leaked key is recognisable in logs and
// secret scanners.
const KeyPrefix = "tg_"

// KeyPrefixLen is how much of a key api_keys.prefix keeps and key listings show: enough to
// tell a user's keys apart, too little to use. Revoking by prefix compares it whole.
const KeyPrefixLen = 10

// ShownPrefix is the part of key that api_keys.prefix keeps, logs and listings show (all of a
// key shorter than that, which no key the gateway makes is).
func ShownPrefix(key string) string { return key[:min(len(key), KeyPrefixLen)] }

// CreateKey issues a key for a user and returns it; only its SHA-256 is stored, so this is
// the one time anyone sees it. A refusal read_only or for want of room on the database's disk
// (1114, 1021) is tried again until ctx ends, as
// CreateUser's; a failure whose INSERT may have landed is not (a second key would be made,
// the first live and shown to nobody).
func (s *Store) CreateKey(ctx context.Context, userID uint64) (string, error) {
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("create key: %w", err)
	}
	key := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	hash := HashKey(key)
	_, err := s.execUntilWritable(ctx, "create key", nil, "INSERT INTO api_keys (key_hash, user_id, prefix) VALUES (?, ?, ?)", hash[:], userID, ShownPrefix(key))
	if err != nil {
		return "", fmt.Errorf("create key for user %d: %w", userID, err)
	}
	return key, nil
}

// RevokeKey refuses a key from now on. A key that is not live (never issued, already revoked)
// is ErrKeyNotFound, which the admin API answers 404 and callers tell from a database failure.
// A refusal read_only or for want of room (the revocation grows the key's row, which may split
// its page) is tried again until ctx ends (execUntilWritable).
func (s *Store) RevokeKey(ctx context.Context, key string) error {
	hash := HashKey(key)
	res, err := s.execUntilWritable(ctx, "revoke key", nil, "UPDATE api_keys SET revoked_at = NOW(6) WHERE key_hash = ? AND revoked_at IS NULL", hash[:])
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("revoke key: %w", ErrKeyNotFound)
	}
	return nil
}

// HashKey is how keys are stored and looked up.
func HashKey(key string) [32]byte { return sha256.Sum256([]byte(key)) }

// ErrBadKey is an unknown or revoked key.
var ErrBadKey = errors.New("invalid API key")

// WellFormedKey reports whether key has the shape of a key tollgate issues (KeyPrefix, at most
// 128 bytes): one that has not cannot be in the store, and is refused without asking it.
func WellFormedKey(key string) bool { return strings.HasPrefix(key, KeyPrefix) && len(key) <= 128 }

// UserByKey authenticates a key: UsersByKeys of one. Revoked keys and disabled users are both
// ErrBadKey, so a caller learns nothing from the difference. The gateway batches its lookups
// (KeyLookup); this is for tests and tools.
func (s *Store) UserByKey(ctx context.Context, key string) (User, error) {
	out, err := s.UsersByKeys(ctx, []string{key})
	if err != nil {
		return User{}, err
	}
	return out[0].User, out[0].Err
}

// KeyResult is one key's lookup within a batch: its user, or ErrBadKey.
type KeyResult struct {
	User User
	Err  error
}

// UsersByKeys authenticates many keys in one query: a burst of new callers (a deploy, a cold
// cache) then costs one round trip per batch rather than one per caller.
func (s *Store) UsersByKeys(ctx context.Context, keys []string) ([]KeyResult, error) {
	out := make([]KeyResult, len(keys))
	hashes := make([][]byte, 0, len(keys))
	for i, key := range keys {
		if !WellFormedKey(key) {
			out[i].Err = ErrBadKey
			continue
		}
		h := HashKey(key)
		hashes = append(hashes, h[:])
	}
	if len(hashes) == 0 {
		return out, nil
	}
	q, args, err := sqlx.In(`
		SELECT k.key_hash, u.id, u.name, u.plan FROM api_keys k JOIN users u ON u.id = k.user_id
		WHERE k.key_hash IN (?) AND k.revoked_at IS NULL AND u.disabled_at IS NULL`, hashes)
	if err != nil {
		return nil, fmt.Errorf("look up %d keys: %w", len(hashes), err)
	}
	var rows []struct {
		Hash []byte `db:"key_hash"`
		ID   uint64 `db:"id"`
		Name string `db:"name"`
		Plan string `db:"plan"`
	}
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("look up %d keys: %w", len(hashes), err)
	}
	byHash := make(map[[32]byte]User, len(rows))
	for _, r := range rows {
		var h [32]byte
		copy(h[:], r.Hash)
		byHash[h] = User{ID: r.ID, Name: r.Name, Plan: r.Plan}
	}
	for i, key := range keys {
		if out[i].Err != nil {
			continue
		}
		if u, ok := byHash[HashKey(key)]; ok {
			out[i].User = u
		} else {
			out[i].Err = ErrBadKey
		}
	}
	return out, nil
}
