package proxy

import (
	"context"
	"errors"
	"strconv"
	"strings"
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

// keyCacheFixture is a store with one user and a fresh key cache over it.
func keyCacheFixture(t *testing.T, ttl time.Duration) (context.Context, *holds.Store, holds.User, *keyCache) {
	t.Helper()
	db := testenv.MySQL(t)
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 1_000_000, HoldNormalMicro: 1_000, HoldHeavyMicro: 1_000,
		HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 10_000}}
	st := holds.NewStore(db, plans, "standard", zap.NewNop())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	u, err := st.CreateUser(ctx, "refused-"+testenv.RandomID(4), "standard")
	if err != nil {
		t.Fatal(err)
	}
	c := newKeyCache(st, ttl)
	t.Cleanup(c.lookups.Close)
	return ctx, st, u, c
}

// countLookups counts, from now on, the lookups c answered itself (hits) and those it asked
// the store (misses).
func countLookups(c *keyCache) (hits, misses *int) {
	hits, misses = new(int), new(int)
	f := func(hit bool) {
		if hit {
			*hits++
		} else {
			*misses++
		}
	}
	c.observe.Store(&f)
	return hits, misses
}

// TestKeyCacheKeepsARefusalForItsTTL: a key the store refused — revoked, never issued, or a
// disabled user's — is refused from the cache for key_cache_ttl, so a client retrying with it
// costs one query per TTL, not one per request; once the refusal ends the store is asked
// again, and a user enabled meanwhile is accepted. With the cache off (ttl 0) every lookup goes
// to the store. Mutants: the refusal not kept (misses 21), its expiry not checked (the enabled
// user still refused), the configured TTL ignored (hits with the cache off).
func TestKeyCacheKeepsARefusalForItsTTL(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{{"an hour", time.Hour}, {"off", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, st, u, c := keyCacheFixture(t, tc.ttl)
			revoked, err := st.CreateKey(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.RevokeAPIKey(ctx, revoked); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{revoked, holds.KeyPrefix + "never-issued-" + testenv.RandomID(8)} {
				hits, misses := countLookups(c)
				for range 21 {
					if _, err := c.lookup(ctx, key); !errors.Is(err, holds.ErrBadKey) {
						t.Fatalf("refused key: %v, want holds.ErrBadKey", err)
					}
				}
				wantHits, wantMisses := 20, 1
				if tc.ttl == 0 {
					wantHits, wantMisses = 0, 21
				}
				if *hits != wantHits || *misses != wantMisses {
					t.Fatalf("21 lookups of a refused key (ttl %v): %d from the cache, %d from the store; want %d and %d",
						tc.ttl, *hits, *misses, wantHits, wantMisses)
				}
			}

			key, err := st.CreateKey(ctx, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.DisableUser(ctx, u.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := c.lookup(ctx, key); !errors.Is(err, holds.ErrBadKey) {
				t.Fatalf("a disabled user's key: %v, want holds.ErrBadKey", err)
			}
			if _, err := st.EnableUser(ctx, u.ID); err != nil {
				t.Fatal(err)
			}
			if tc.ttl > 0 {
				if _, err := c.lookup(ctx, key); !errors.Is(err, holds.ErrBadKey) {
					t.Fatalf("a user enabled within the refusal's TTL: %v, want still refused (the documented delay)", err)
				}
				// The refusal's TTL passes.
				c.mu.Lock()
				for h := range c.refused {
					c.refused[h] = time.Now().Add(-time.Millisecond)
				}
				c.mu.Unlock()
			}
			if got, err := c.lookup(ctx, key); err != nil || got.ID != u.ID {
				t.Fatalf("the enabled user's key once its refusal ended: %+v, %v", got, err)
			}
			c.mu.Lock()
			_, kept := c.refused[holds.HashKey(key)]
			c.mu.Unlock()
			if kept {
				t.Fatal("an accepted key's old refusal is still kept")
			}
		})
	}
}

// TestKeyCacheRefusalsHaveTheirOwnBound: made-up keys start over the refusals' map past its
// bound and leave the accepted keys cached. Mutant: the bound check dropped.
func TestKeyCacheRefusalsHaveTheirOwnBound(t *testing.T) {
	ctx, st, u, c := keyCacheFixture(t, time.Hour)
	c.maxRefused = 4
	key, err := st.CreateKey(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.lookup(ctx, key); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := c.lookup(ctx, holds.KeyPrefix+"made-up-"+strconv.Itoa(i)); !errors.Is(err, holds.ErrBadKey) {
			t.Fatalf("made-up key %d: %v", i, err)
		}
		c.mu.Lock()
		n := len(c.refused)
		c.mu.Unlock()
		if n > c.maxRefused {
			t.Fatalf("%d refusals kept after %d made-up keys, bound %d", n, i+1, c.maxRefused)
		}
	}
	hits, misses := countLookups(c)
	if got, err := c.lookup(ctx, key); err != nil || got.ID != u.ID {
		t.Fatalf("accepted key after the flood: %+v, %v", got, err)
	}
	if *hits != 1 || *misses != 0 {
		t.Fatalf("accepted key after a flood of made-up ones: %d hits, %d misses; want it still cached", *hits, *misses)
	}
}

// TestKeyCacheAsksTheStoreOnlyForKeysItCouldHold: a key not of the shape tollgate issues is
// refused without the store (its lookups stopped here: no ErrBatcherClosed), and a lookup the
// store failed is not kept as a refusal (the next request asks again). Mutants: the shape check
// dropped (the closed store's error), any failure kept as a refusal.
func TestKeyCacheAsksTheStoreOnlyForKeysItCouldHold(t *testing.T) {
	ctx, _, _, c := keyCacheFixture(t, time.Hour)
	c.lookups.Close()
	hits, misses := countLookups(c)
	for _, key := range []string{"sk-not-ours", holds.KeyPrefix + strings.Repeat("x", 200)} {
		if _, err := c.lookup(ctx, key); !errors.Is(err, holds.ErrBadKey) {
			t.Fatalf("key %.20q…: %v, want holds.ErrBadKey without the store", key, err)
		}
	}
	if *hits != 0 || *misses != 0 {
		t.Fatalf("malformed keys: %d hits, %d misses; want neither cache nor store asked", *hits, *misses)
	}
	if _, err := c.lookup(ctx, holds.KeyPrefix+"well-formed"); err == nil || errors.Is(err, holds.ErrBadKey) {
		t.Fatalf("well-formed key with the store's lookups stopped: %v, want their error", err)
	}
	c.mu.Lock()
	n := len(c.refused)
	c.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d refusals kept after a failed lookup, want 0", n)
	}
}
