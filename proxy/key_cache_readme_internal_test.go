package proxy

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestREADMEStatesWhatTheKeyCacheKeeps: README's "Sizing the process" is where an operator
// reads what a gateway's memory holds per caller, and what a flood of made-up names costs it.
// It said the key cache kept valid keys only and that nothing in process kept a wrong key;
// the cache keeps the refusals of keys of tollgate's shape too (a revoked key, a made-up
// one), up to their own bound, so that a client retrying a dead key costs one query per
// key_cache_ttl. Both bounds must be the ones README states.
func TestREADMEStatesWhatTheKeyCacheKeeps(t *testing.T) {
	ctx, _, _, c := keyCacheFixture(t, time.Hour)
	madeUp := holds.KeyPrefix + "made-up-for-the-readme"
	if _, err := c.lookup(ctx, madeUp); !errors.Is(err, holds.ErrBadKey) {
		t.Fatalf("made-up key: %v, want holds.ErrBadKey", err)
	}
	c.mu.Lock()
	_, kept := c.refused[holds.HashKey(madeUp)]
	c.mu.Unlock()
	if !kept {
		t.Fatal("a made-up key's refusal is not kept: README's account of the refusals is then wrong the other way")
	}

	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(raw)), " ")
	_, sizing, ok := strings.Cut(readme, "**Sizing the process.**")
	if !ok {
		t.Fatal("README has no **Sizing the process.** paragraph")
	}
	sizing, _, _ = strings.Cut(sizing, "**")
	for _, want := range []string{
		"accepted keys, at most " + spacedThousands(maxCachedKeys),
		"the refusals of keys of tollgate's shape (a revoked key, a made-up one), at most " + spacedThousands(maxRefusedKeys),
	} {
		if !strings.Contains(sizing, want) {
			t.Errorf("README's Sizing the process does not state %q", want)
		}
	}
	if strings.Contains(sizing, "valid keys only") || strings.Contains(sizing, "(a wrong key,") {
		t.Error("README's Sizing the process says no wrong key is kept in process; the key cache keeps their refusals")
	}
}

// spacedThousands writes n as README writes figures: groups of three digits apart by a space.
func spacedThousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}
