package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestAccountCommandsNameThemselvesInTheirRetryLines: while the database refused writes
// (read_only, a failover's demoted primary), `gateway user create` and `key create` logged
// "database unavailable, retrying" without the command field every other admin command's
// lines carry (adminEnv): an operator reading the log of a host that ran several could not
// tell which one waited. Each command's retry line names it now.
func TestAccountCommandsNameThemselvesInTheirRetryLines(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if _, err := stdout(t, func() error { return userCreate(ctx, []string{"-name", "existing"}) }); err != nil {
		t.Fatal(err)
	}
	dsn := os.Getenv("MYSQL_DSN") // the test database's, useTestDatabase's
	root := testenv.Open(t, dsn)
	readOnly := testenv.ServerReadOnly(t, root)
	// An account read_only binds: the tests' own has every privilege, which read_only lets write.
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = "tg_cmd_"+testenv.RandomID(4), testenv.RandomID(8)
	if _, err := root.ExecContext(ctx, "CREATE USER '"+cfg.User+"'@'%' IDENTIFIED BY '"+cfg.Passwd+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = root.Exec("DROP USER IF EXISTS '" + cfg.User + "'@'%'") })
	if _, err := root.ExecContext(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON `"+cfg.DBName+"`.* TO '"+cfg.User+"'@'%'"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MYSQL_DSN", cfg.FormatDSN())

	for _, c := range []struct {
		command string
		run     func(context.Context, []string) error
		args    []string
	}{
		{"user create", userCreate, []string{"-name", "made-while-read-only"}},
		{"key create", keyCreate, []string{"-user", "existing"}},
		{"user set", userSet, []string{"-name", "existing", "-max-in-flight", "3"}}, // adminEnv's, as it was
	} {
		readOnly(true)
		lines, err := stderrUntilRetried(t, func() error {
			_, err := stdout(t, func() error { return c.run(ctx, c.args) })
			return err
		}, func() { readOnly(false) })
		if err != nil {
			t.Fatalf("%s once the database took writes again: %v", c.command, err)
		}
		retried := 0
		for _, l := range lines {
			if l["msg"] != "database unavailable, retrying" {
				continue
			}
			retried++
			if l["command"] != c.command {
				t.Errorf("%s's retry line has command %v, want %q: %v", c.command, l["command"], c.command, l)
			}
		}
		if retried == 0 {
			t.Errorf("%s logged no retry while the database was read_only: %v", c.command, lines)
		}
	}
}

// stderrUntilRetried runs fn with os.Stderr, which the commands' logger writes to, captured;
// once a "database unavailable, retrying" line is written it calls recover (once). It returns
// the JSON lines fn's logger wrote, and fn's error. A line that is not JSON fails the test.
func stderrUntilRetried(t *testing.T, fn func() error, recover func()) ([]map[string]any, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan []map[string]any)
	go func() {
		var lines []map[string]any
		recovered := false
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var l map[string]any
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("stderr line is not JSON: %q", sc.Text())
				continue
			}
			lines = append(lines, l)
			if !recovered && strings.Contains(sc.Text(), "database unavailable, retrying") {
				recovered = true
				recover()
			}
		}
		if !recovered {
			recover() // so that fn, still waiting, can end
		}
		done <- lines
	}()
	err = fn()
	os.Stderr = saved
	w.Close()
	return <-done, err
}
