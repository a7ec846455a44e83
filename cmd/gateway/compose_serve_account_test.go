package main

import (
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/internal/testenv"
)

// composeInitDir is where the MySQL image's entrypoint looks for the scripts it runs once, as
// root, when it initialises an empty data directory.
const composeInitDir = "/docker-entrypoint-initdb.d"

// TestComposeServesAsADMLOnlyAccount: docker-compose.yml's gateway serves as an account with
// SELECT, INSERT, UPDATE and DELETE on its database and nothing else, as `make run`'s does
// (README, Failovers and maintenance), while its migrate service (migrate, demo-setup, the
// operator's commands) keeps the image's MYSQL_USER, which has ALL on the database: serving as
// that one, the gateway could drop or alter the schema it keeps the money in. The account is
// made by the SQL the compose mounts into the image's init directory. No Docker here: the test
// runs that SQL as the entrypoint does (the client fed the file, the database set to
// MYSQL_DATABASE), against the tests' server as an account that may grant, then logs in with
// the gateway service's own DSN credentials and checks what they may do, and that serve's start
// check says nothing for them.
func TestComposeServesAsADMLOnlyAccount(t *testing.T) {
	ctx := context.Background()
	c := readCompose(t)
	serveDSN, err := mysql.ParseDSN(c.Services["gateway"].Environment["MYSQL_DSN"])
	if err != nil {
		t.Fatalf("docker-compose.yml's gateway MYSQL_DSN: %v", err)
	}
	if owner := c.Services["mysql"].Environment["MYSQL_USER"]; serveDSN.User == owner {
		t.Fatalf("docker-compose.yml's gateway serves as %q, the image's MYSQL_USER, which has ALL on the database", owner)
	}
	scripts := composeInitScripts(t, c.Services["mysql"].Volumes)
	if len(scripts) == 0 {
		t.Fatalf("docker-compose.yml's mysql mounts no .sql into %s: nothing makes the account %q its gateway serves as", composeInitDir, serveDSN.User)
	}

	dsn := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if serveDSN.User == cfg.User {
		t.Fatalf("docker-compose.yml's gateway serves as %q, the tests' own account: the test would drop it", cfg.User)
	}
	root := testenv.Open(t, dsn)
	// The account it checks is bound by read_only, which another package's test may turn on.
	testenv.NoReadOnlySpell(t, root)
	dropServe := func() {
		var hosts []string
		_ = root.SelectContext(ctx, &hosts, "SELECT Host FROM mysql.user WHERE User = ?", serveDSN.User)
		for _, h := range hosts {
			_, _ = root.ExecContext(ctx, "DROP USER IF EXISTS '"+serveDSN.User+"'@'"+h+"'")
		}
	}
	dropServe()
	t.Cleanup(dropServe)
	for _, s := range scripts {
		runInitScript(t, cfg, s)
	}

	// Exactly DML on the database: USAGE alone globally, no table or column grants, nothing
	// grantable (a database name's _ is escaped in a grant, as the image escapes MYSQL_DATABASE).
	grantee := "'" + serveDSN.User + "'@'%'"
	type priv struct {
		Scope     string `db:"scope"`
		Schema    string `db:"schema_name"`
		Privilege string `db:"privilege"`
		Grantable string `db:"grantable"`
	}
	var privs []priv
	if err := root.SelectContext(ctx, &privs, `
		SELECT 'global' AS scope, '' AS schema_name, PRIVILEGE_TYPE AS privilege, IS_GRANTABLE AS grantable
			FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT 'schema', TABLE_SCHEMA, PRIVILEGE_TYPE, IS_GRANTABLE
			FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT 'table', TABLE_SCHEMA, PRIVILEGE_TYPE, IS_GRANTABLE
			FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = ?
		UNION ALL SELECT 'column', TABLE_SCHEMA, PRIVILEGE_TYPE, IS_GRANTABLE
			FROM information_schema.COLUMN_PRIVILEGES WHERE GRANTEE = ?
		ORDER BY scope, privilege`, grantee, grantee, grantee, grantee); err != nil {
		t.Fatalf("read %s's privileges: %v", grantee, err)
	}
	var got []string
	for _, p := range privs {
		s := p.Scope + " " + p.Privilege
		if p.Scope != "global" {
			s += " on " + strings.ReplaceAll(p.Schema, `\_`, "_")
		}
		if p.Grantable != "NO" {
			s += " grantable"
		}
		got = append(got, s)
	}
	want := []string{"global USAGE"}
	for _, p := range []string{"DELETE", "INSERT", "SELECT", "UPDATE"} {
		want = append(want, "schema "+p+" on "+cfg.DBName)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s, made by %v, holds %q; want %q", grantee, scripts, got, want)
	}

	as := *cfg
	as.User, as.Passwd = serveDSN.User, serveDSN.Passwd
	serve := testenv.Open(t, as.FormatDSN())
	var tables []string
	if err := root.SelectContext(ctx, &tables, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME"); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if _, err := serve.ExecContext(ctx, "SELECT * FROM `"+tb+"` LIMIT 1"); err != nil {
			t.Errorf("%s cannot read %s: %v", serveDSN.User, tb, err)
		}
	}
	name := "compose_" + testenv.RandomID(4)
	for _, stmt := range []struct{ sql, what string }{
		{"INSERT INTO users (name, plan) VALUES (?, 'free')", "INSERT"},
		{"UPDATE users SET prepaid_micro = 7 WHERE name = ?", "UPDATE"},
		{"DELETE FROM users WHERE name = ? AND prepaid_micro = 7", "DELETE"},
	} {
		res, err := serve.ExecContext(ctx, stmt.sql, name)
		if err != nil {
			t.Fatalf("%s cannot %s users: %v", serveDSN.User, stmt.what, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("%s's %s on users changed %d rows (%v); want 1", serveDSN.User, stmt.what, n, err)
		}
	}

	// Refused the schema: each statement names the privilege it would need.
	for _, ddl := range []string{
		"CREATE TABLE compose_probe (id INT)",
		"ALTER TABLE users ADD COLUMN compose_probe INT",
		"CREATE INDEX compose_probe ON users (plan)",
		"DROP TABLE users",
		"CREATE DATABASE compose_probe_" + testenv.RandomID(4),
	} {
		_, err := serve.ExecContext(ctx, ddl)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || (me.Number != 1142 && me.Number != 1044) {
			t.Errorf("%s ran %q: %v; want it refused (error 1142 or 1044)", serveDSN.User, ddl, err)
		}
	}

	core, logs := observer.New(zapcore.WarnLevel)
	warnReadOnlyBypass(ctx, serve, zap.New(core))
	if logs.Len() != 0 {
		t.Errorf("serve's start check, as %s: %v; want nothing said", serveDSN.User, logs.All())
	}
}

// composeFile is the part of docker-compose.yml the compose tests read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Entrypoint  []string          `yaml:"entrypoint"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// composeInitScripts are the repository's files that volumes (short syntax, SOURCE:TARGET[:MODE])
// put into composeInitDir, in the order the entrypoint runs them (by name in that directory).
// Only .sql: a .sh there runs with the entrypoint's shell functions, which no test has.
func composeInitScripts(t *testing.T, volumes []string) []string {
	t.Helper()
	byTarget := map[string]string{}
	for _, v := range volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue // a named volume
		}
		src, target := filepath.Join("../..", parts[0]), parts[1]
		switch {
		case target == composeInitDir:
			files, err := filepath.Glob(filepath.Join(src, "*"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				byTarget[filepath.Base(f)] = f
			}
		case filepath.Dir(target) == composeInitDir:
			byTarget[filepath.Base(target)] = src
		}
	}
	var scripts []string
	for _, name := range slices.Sorted(maps.Keys(byTarget)) {
		if filepath.Ext(name) != ".sql" {
			t.Fatalf("docker-compose.yml puts %s into %s; the test runs .sql only", name, composeInitDir)
		}
		if _, err := os.Stat(byTarget[name]); err != nil {
			t.Fatalf("docker-compose.yml mounts %s into %s: %v", byTarget[name], composeInitDir, err)
		}
		scripts = append(scripts, byTarget[name])
	}
	return scripts
}

// runInitScript runs the SQL file path as the image's entrypoint does (docker_process_sql: the
// command-line client, --comments, --database=$MYSQL_DATABASE, the file on its stdin), against
// the server and database of cfg as its account, which may create accounts and grant, as the
// entrypoint's root may.
func runInitScript(t *testing.T, cfg *mysql.Config, path string) {
	t.Helper()
	client, err := exec.LookPath("mariadb")
	if err != nil {
		if client, err = exec.LookPath("mysql"); err != nil {
			t.Fatal("no mariadb or mysql client to run the init script with (scripts/services.sh installs one)")
		}
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		t.Fatalf("the tests' DSN address %q: %v", cfg.Addr, err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(client, "--no-defaults", "--protocol=tcp", "--host="+host, "--port="+port,
		"--user="+cfg.User, "--comments", "--batch", "--database="+cfg.DBName)
	cmd.Env = append(os.Environ(), "MYSQL_PWD="+cfg.Passwd)
	cmd.Stdin = f
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s < %s: %v\n%s", client, path, err, out)
	}
}
