package main

import (
	"context"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestServeWarnsWhenReadOnlyDoesNotBindItsAccount: README promises that a MariaDB set
// read_only — a primary demoted by a failover — refuses the gateway's writes, provided its
// account has neither SUPER nor READ_ONLY ADMIN. The tests' account (and the one `make run`
// served as) has ALL PRIVILEGES, with which a demoted primary takes the gateway's admissions and
// settlements beside the promoted one, and serve started on it without a word. It says so at
// start now, naming the privileges, and says nothing for an account read_only binds (the
// DML-only one `make run` serves as now).
func TestServeWarnsWhenReadOnlyDoesNotBindItsAccount(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t)
	root := testenv.Open(t, dsn)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// account creates an account with DML on the tests' database and the global privileges
	// given (may be ""), and returns its DSN; it is dropped at cleanup.
	account := func(global string) string {
		c := *cfg
		c.User, c.Passwd = "tg_rob_"+testenv.RandomID(4), testenv.RandomID(8)
		if _, err := root.ExecContext(ctx, "CREATE USER '"+c.User+"'@'%' IDENTIFIED BY '"+c.Passwd+"'"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = root.Exec("DROP USER IF EXISTS '" + c.User + "'@'%'") })
		if _, err := root.ExecContext(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+c.DBName+"`.* TO '"+c.User+"'@'%'"); err != nil {
			t.Fatal(err)
		}
		if global != "" {
			if _, err := root.ExecContext(ctx, "GRANT "+global+" ON *.* TO '"+c.User+"'@'%'"); err != nil {
				t.Fatal(err)
			}
		}
		return c.FormatDSN()
	}
	for _, tc := range []struct {
		name string
		dsn  string
		warn bool
	}{
		{"ALL PRIVILEGES, as the tests' account", account("ALL PRIVILEGES"), true},
		{"SUPER", account("SUPER"), true},
		{"SELECT, INSERT, UPDATE, DELETE on its database, as make run's gateway_serve", account(""), false},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		warnReadOnlyBypass(ctx, testenv.Open(t, tc.dsn), zap.New(core))
		warned := false
		for _, e := range logs.All() {
			w, _ := e.ContextMap()["warning"].(string)
			warned = warned || (e.Message == "database weakens a guarantee" && strings.Contains(w, "SUPER") && strings.Contains(w, "read_only"))
		}
		if warned != tc.warn || logs.Len() != map[bool]int{false: 0, true: 1}[tc.warn] {
			t.Errorf("%s: logged %v; want the warning: %v", tc.name, logs.All(), tc.warn)
		}
	}
}
