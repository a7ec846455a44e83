package main

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestCommandsReachNoUserByANameOnlyTheCollationMatches: `grant -user josé` credited the user
// jose, and `user disable -name "jose "` disabled him: the column's collation folds accents
// and ignores trailing spaces, and no user can have either name. They name no user now;
// ASCII case still does not matter.
func TestCommandsReachNoUserByANameOnlyTheCollationMatches(t *testing.T) {
	q := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "jose"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"jos\u00e9", "jose ", "JOS\u00c9"} {
		_, err := stdout(t, func() error { return grantCmd(ctx, []string{"-user", name, "-amount", "5", "-key", "k-" + name}) })
		if !errors.Is(err, holds.ErrUnknownUser) {
			t.Errorf("grant -user %q: %v, want unknown user", name, err)
		}
		_, err = stdout(t, func() error { return userDisable(ctx, []string{"-name", name}) })
		if !errors.Is(err, holds.ErrUnknownUser) {
			t.Errorf("user disable -name %q: %v, want unknown user", name, err)
		}
	}
	if n := q("SELECT COUNT(*) FROM users WHERE name = 'jose' AND prepaid_micro = 0 AND disabled_at IS NULL"); n != 1 {
		t.Fatal("jose was credited or disabled by a name that is not his")
	}
	if _, err := stdout(t, func() error { return grantCmd(ctx, []string{"-user", "JOSE", "-amount", "5", "-key", "k-upper"}) }); err != nil {
		t.Fatalf("grant -user JOSE: %v, want jose credited", err)
	}
}
