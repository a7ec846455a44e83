package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestKeyCacheRefusesARevokedKeyOnceItsEntryEnds: README's promise that a revoked key is
// refused within key_cache_ttl. Within the TTL the cached user still answers (the documented
// delay); once the entry has ended, the lookup goes to the store and is refused; with the
// cache off (ttl 0) at once. Mutants: the expiry check of a cached entry dropped (`ok &&
// now.Before(e.expires)` -> `ok`), and an entry stored without the configured TTL.
func TestKeyCacheRefusesARevokedKeyOnceItsEntryEnds(t *testing.T) {
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 1_000_000, HoldNormalMicro: 1_000, HoldHeavyMicro: 1_000,
		HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 10_000}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := st.CreateUser(ctx, "cached-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	newKey := func() string {
		k, err := st.CreateKey(ctx, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"an hour", time.Hour}, {"off", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newKeyCache(st, tc.ttl)
			defer c.lookups.Close()
			key := newKey()
			if got, err := c.lookup(ctx, key); err != nil || got.ID != u.ID {
				t.Fatalf("live key: %+v, %v", got, err)
			}
			if _, err := st.RevokeAPIKey(ctx, key); err != nil {
				t.Fatal(err)
			}
			if tc.ttl > 0 {
				if _, err := c.lookup(ctx, key); err != nil {
					t.Fatalf("revoked key within its cached entry's TTL: %v, want the cached user (the documented delay)", err)
				}
				// The entry's TTL passes.
				c.mu.Lock()
				for h, e := range c.entries {
					e.expires = time.Now().Add(-time.Millisecond)
					c.entries[h] = e
				}
				c.mu.Unlock()
			}
			if _, err := c.lookup(ctx, key); !errors.Is(err, holds.ErrBadKey) {
				t.Fatalf("revoked key after its cached entry ended (ttl %v): %v, want holds.ErrBadKey", tc.ttl, err)
			}
		})
	}
}

// TestKeyCacheStartsOverPastItsBound: past maxCachedKeys entries the cache starts over, so a
// flood of distinct keys cannot grow it without bound. Mutant: the bound check dropped.
func TestKeyCacheStartsOverPastItsBound(t *testing.T) {
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 1_000_000, HoldNormalMicro: 1_000, HoldHeavyMicro: 1_000,
		HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 10_000}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := st.CreateUser(ctx, "bound-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	key, err := st.CreateKey(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := newKeyCache(st, time.Hour)
	defer c.lookups.Close()
	for i := range maxCachedKeys {
		c.entries[[32]byte{byte(i), byte(i >> 8), byte(i >> 16)}] = cachedUser{}
	}
	if _, err := c.lookup(ctx, key); err != nil {
		t.Fatal(err)
	}
	if n := len(c.entries); n != 1 {
		t.Fatalf("%d entries after a lookup with the cache full, want 1: it starts over", n)
	}
}
