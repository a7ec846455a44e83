package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// useTestDatabase points the subcommands' configuration (MYSQL_DSN) at a fresh migrated test
// database and returns it opened, for the test to look at what a command wrote.
func useTestDatabase(t *testing.T) func(query string, args ...any) int {
	t.Helper()
	dsn := testenv.MySQLDSN(t)
	t.Setenv("MYSQL_DSN", dsn)
	db, err := holds.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Get(&n, query, args...); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestUserCreateRefusesNamesTheAPIRefuses: `gateway user create` wrote any name of 1-128
// bytes, while POST /admin/users refused those outside its pattern; a user named "a b" or
// "a/b" could then not be reached through the API's /users/{name}. The rule now lives in the
// store, so both refuse the same names (holds.ErrInvalidName) and nothing is written.
func TestUserCreateRefusesNamesTheAPIRefuses(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	for _, name := range []string{"", "a b", "a/b", "-lead", ".lead", "caf\u00e9", "a\nb", strings.Repeat("x", 129)} {
		err := userCreate(ctx, []string{"-name", name})
		if !errors.Is(err, holds.ErrInvalidName) {
			t.Errorf("user create -name %q: %v, want holds.ErrInvalidName", name, err)
		}
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 0 {
		t.Fatalf("%d users were written for names the API refuses", n)
	}
	for _, name := range []string{"alice", "a.b_c@d+e-f", strings.Repeat("x", 128)} {
		if err := userCreate(ctx, []string{"-name", name}); err != nil {
			t.Errorf("user create -name %q: %v", name, err)
		}
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 3 {
		t.Fatalf("%d users, want the 3 with valid names", n)
	}
}
