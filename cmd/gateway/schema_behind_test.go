package main

import (
	"context"
	"strings"
	"testing"
)

// TestOperatorCommandsRefuseASchemaBehind: `gateway serve` refuses a schema behind the binary,
// naming the migrations it lacks and `gateway migrate`; the operator's commands ran on it and
// failed at their first statement on a missing column or table ("Error 1054: Unknown column
// 'cache_write_1h_tok'", "Table '….instances' doesn't exist"), saying nothing of the upgrade
// step skipped — `prune` even said to run it again — while those whose statements still fit
// (user create, grant) wrote. Each now refuses before it writes anything, as serve does.
func TestOperatorCommandsRefuseASchemaBehind(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	// The database as a binary of before 015 left it.
	for _, q := range []string{"DROP TABLE instances", "DELETE FROM schema_migrations WHERE version >= 15"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		cmd  func(context.Context, []string) error
		args []string
	}{
		{"user create", userCreate, []string{"-name", "bob"}},
		{"grant", grantCmd, []string{"-user", "alice", "-amount", "5", "-key", "pay-1"}},
		{"instances", instancesCmd, nil},
		{"prune", pruneCmd, []string{"-days", "7"}},
		{"audit", auditCmd, nil},
		{"runs", runsCmd, nil},
	} {
		_, err := stdout(t, func() error { return c.cmd(ctx, c.args) })
		if err == nil || !strings.Contains(err.Error(), "gateway migrate") || !strings.Contains(err.Error(), "015_instances.sql") {
			t.Errorf("%s on a schema without 015: %v, want it refused naming 015_instances.sql and `gateway migrate`", c.name, err)
		}
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 1 {
		t.Errorf("%d users after user create on a schema behind, want alice alone", n)
	}
	if n := count("SELECT COUNT(*) FROM grants"); n != 0 {
		t.Errorf("%d grants written on a schema behind, want none", n)
	}
}
