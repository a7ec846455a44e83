package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestKeyCreateNamesTheUserOnce: `key create` wrapped UserByName's error with the user's name,
// which UserByName had already done for a database error: it read `user "alice": user
// "alice": …`. The name is given once, for an unknown user (still holds.ErrUnknownUser) as
// for a database failure (here: the users table gone).
func TestKeyCreateNamesTheUserOnce(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	err := keyCreate(ctx, []string{"-user", "alice"})
	if !errors.Is(err, holds.ErrUnknownUser) || strings.Count(err.Error(), `user "alice"`) != 1 {
		t.Fatalf("key create for an unknown user: %v; want ErrUnknownUser naming the user once", err)
	}
	if _, err := openTestDatabase(t).ExecContext(ctx, "RENAME TABLE users TO users_gone"); err != nil {
		t.Fatal(err)
	}
	err = keyCreate(ctx, []string{"-user", "alice"})
	if err == nil || strings.Count(err.Error(), `user "alice"`) != 1 {
		t.Fatalf("key create with the users table gone: %v; want the database error naming the user once", err)
	}
}

// TestKeyCreateWithoutUserSaysTheFlagIsRequired: `key create` with no -user answered
// `user "": unknown user`, as if a user named "" were looked for and missing; every other
// command that needs a user says `-user is required`, and so does it now.
func TestKeyCreateWithoutUserSaysTheFlagIsRequired(t *testing.T) {
	useTestDatabase(t)
	if err := keyCreate(testCtx(t), nil); err == nil || err.Error() != "-user is required" {
		t.Fatalf("key create without -user: %v; want -user is required", err)
	}
}
