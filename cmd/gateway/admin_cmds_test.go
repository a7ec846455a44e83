package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
)

// useTestDatabase points the subcommands' configuration (MYSQL_DSN) at a fresh migrated test
// database and returns it opened, for the test to look at what a command wrote.
func useTestDatabase(t *testing.T) func(query string, args ...any) int {
	t.Helper()
	dsn := testenv.MySQLDSN(t)
	t.Setenv("MYSQL_DSN", dsn)
	db := testenv.Open(t, dsn)
	servedAt(t, db, 1000)
	return func(query string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Get(&n, query, args...); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// servedAt records creditMicro as the credit_micro the fleet serves at, and the default
// config's plans at it as its plan terms, as `gateway serve` does at start: the operator's
// commands that convert credits, or use plan terms, require them.
func servedAt(t *testing.T, db *sqlx.DB, creditMicro int64) {
	t.Helper()
	cfg := config.Default()
	cfg.CreditMicro = creditMicro
	st := holds.NewStore(db, plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	if _, _, err := st.RecordCreditUnit(testCtx(t), creditMicro, "test-fleet", true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RecordPlanTerms(testCtx(t), "test-fleet"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RecordTTLs(testCtx(t), cfg.Holds.TallyTTL, cfg.Dedup.ReplayTTL, "test-fleet"); err != nil {
		t.Fatal(err)
	}
}

// useTestRedis points the subcommands at a Redis of their own key prefix, and records that
// prefix as the fleet's, as `gateway serve` does at start: `reconcile -once` requires it.
// After useTestDatabase.
func useTestRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	t.Setenv("REDIS_URL", testenv.RedisURL(t))
	t.Setenv("TOLLGATE_REDIS_PREFIX", prefix)
	st := holds.NewStore(openTestDatabase(t), map[string]holds.Plan{"standard": {}}, "standard", zap.NewNop())
	if _, _, err := st.RecordRedisPrefix(testCtx(t), prefix, "test-fleet", true); err != nil {
		t.Fatal(err)
	}
	return rdb, prefix
}

// openTestDatabase opens the database useTestDatabase pointed the subcommands at, for a test
// to write what no subcommand writes (runs of chosen days).
func openTestDatabase(t *testing.T) *sqlx.DB {
	t.Helper()
	db, err := holds.Open(testCtx(t), os.Getenv("MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
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

// stdout runs fn with os.Stdout captured and returns what it printed.
func stdout(t *testing.T, fn func() error) ([]byte, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	err = fn()
	os.Stdout = saved
	w.Close()
	return <-done, err
}

// listPages runs a listing subcommand page by page, -limit at a time, following has_more and
// last_id, and returns the rows' field idField in the order printed. Only the last page may
// say has_more false.
func listPages(t *testing.T, cmd func(context.Context, []string) error, args []string, limit int, idField string) []string {
	t.Helper()
	var ids []string
	after := []string{}
	for page := 0; page < 50; page++ {
		raw, err := stdout(t, func() error {
			return cmd(testCtx(t), append(append(slices.Clone(args), "-limit", strconv.Itoa(limit)), after...))
		})
		if err != nil {
			t.Fatalf("%v -limit %d %v: %v", args, limit, after, err)
		}
		var out struct {
			Data    []map[string]any `json:"data"`
			HasMore *bool            `json:"has_more"`
			LastID  any              `json:"last_id"`
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&out); err != nil || out.HasMore == nil {
			t.Fatalf("%v: printed %s, want the API's list object (%v)", args, raw, err)
		}
		for _, row := range out.Data {
			ids = append(ids, fmt.Sprint(row[idField]))
		}
		if !*out.HasMore {
			return ids
		}
		if len(out.Data) != limit {
			t.Fatalf("%v: has_more on a page of %d rows, short of %d", args, len(out.Data), limit)
		}
		after = []string{"-after", fmt.Sprint(out.LastID)}
	}
	t.Fatalf("%v: the listing never ends", args)
	return nil
}

// TestListingSubcommandsPage: `gateway user list` and `runs` printed a bare array (no way to
// tell the last page), and no subcommand listed a user's keys at all, though `key revoke
// -prefix` needs their prefixes. user list and the new key list print the API's page
// (has_more, last_id) and walk every row once by -after; a -limit past the API's 1000 is
// refused.
func TestListingSubcommandsPage(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	for _, name := range []string{"bob", "Alice", "carol", "dave", "Eve"} {
		if err := userCreate(ctx, []string{"-name", name}); err != nil {
			t.Fatal(err)
		}
	}
	var prefixes []string
	for range 5 {
		raw, err := stdout(t, func() error { return keyCreate(ctx, []string{"-user", "carol"}) })
		if err != nil {
			t.Fatal(err)
		}
		prefixes = append([]string{string(raw[:10])}, prefixes...) // newest first
	}
	for limit := 1; limit <= 6; limit++ {
		if got, want := listPages(t, userList, nil, limit, "name"), []string{"Alice", "bob", "carol", "dave", "Eve"}; !slices.Equal(got, want) {
			t.Errorf("user list by %d: %v, want %v", limit, got, want)
		}
		if got := listPages(t, keyList, []string{"-user", "carol"}, limit, "prefix"); !slices.Equal(got, prefixes) {
			t.Errorf("key list by %d: %v, want %v", limit, got, prefixes)
		}
	}
	for _, cmd := range []func(context.Context, []string) error{userList, runsCmd} {
		if err := cmd(ctx, []string{"-limit", "1001"}); err == nil || !strings.Contains(err.Error(), "-limit 1001") {
			t.Errorf("-limit 1001: %v, want it refused", err)
		}
	}
}

// TestRunsBySettlementListsAReportDay: `gateway runs -settled-since D -settled-until D+1` lists,
// page by page, the settled runs the report charges to day D — the one begun the day before and
// settled after midnight, not the one begun on D and settled the day after — newest settlement
// first; -state running with a settlement window is refused.
func TestRunsBySettlementListsAReportDay(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	if _, err := db.ExecContext(ctx, `INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at, created_at, settled_at)
		SELECT r.id, u.id, 'settled', 0, 0, r.created, r.created, r.settled FROM users u, (
		  SELECT 'r_across' id, TIMESTAMP('2026-03-07 23:59:59.9') created, TIMESTAMP('2026-03-08 00:00:00.1') settled
		  UNION ALL SELECT 'r_morning', '2026-03-08 09:00', '2026-03-08 09:00:01'
		  UNION ALL SELECT 'r_evening', '2026-03-08 23:00', '2026-03-08 23:00:01'
		  UNION ALL SELECT 'r_overnight', '2026-03-08 23:59:59', '2026-03-09 00:00:01') r`); err != nil {
		t.Fatal(err)
	}
	day := []string{"-settled-since", "2026-03-08", "-settled-until", "2026-03-09"}
	for limit := 1; limit <= 4; limit++ {
		if got, want := listPages(t, runsCmd, day, limit, "id"), []string{"r_evening", "r_morning", "r_across"}; !slices.Equal(got, want) {
			t.Errorf("runs settled on 2026-03-08 by %d: %v, want %v", limit, got, want)
		}
	}
	if err := runsCmd(ctx, append(day, "-state", "running")); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("-state running with a settlement window: %v, want holds.ErrBadFilter", err)
	}
}

// TestReportDefaultDayIsTheDatabases: `gateway report` without -from/-to covers the ledger's
// today, the database's UTC day, not this machine's, which may be past midnight from it.
func TestReportDefaultDayIsTheDatabases(t *testing.T) {
	// Every session runs at this instant (the driver sends SET timestamp).
	frozen := time.Date(2026, 3, 7, 23, 59, 59, 900_000_000, time.UTC)
	dsnAt := testenv.DSNAt(t, testenv.MySQLDSN(t), frozen)
	t.Setenv("MYSQL_DSN", dsnAt)
	servedAt(t, openTestDatabase(t), 1000)
	raw, err := stdout(t, func() error { return reportCmd(testCtx(t), []string{"-format", "json"}) })
	if err != nil {
		t.Fatal(err)
	}
	var rep struct{ From, To string }
	if err := json.Unmarshal(raw, &rep); err != nil || rep.From != "2026-03-07" || rep.To != "2026-03-07" {
		t.Fatalf("report %s (%v): want the database's day 2026-03-07", raw, err)
	}
}

// TestPruneCommandDeletesOldSettledRunsAndRefusesAYoungCutoff: `gateway prune` refuses a
// cutoff under a week or within dedup.replay_ttl (an Idempotency-Key replay still reads the
// run), deleting nothing; with a valid one it deletes the settled runs older than it, keeps
// younger and live ones, and the audit still balances.
func TestPruneCommandDeletesOldSettledRunsAndRefusesAYoungCutoff(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	old := databaseTimeDaysAgo(t, db, 20)
	for _, q := range []string{
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, charged_micro, allowance_part_micro, expires_at, settled_at)
		 SELECT 'r_old', id, 'settled', 100, 100, 40, 40, ?, ? FROM users`,
		`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, DATE(?), 40, 1 FROM users`,
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at, settled_at)
		 SELECT 'r_recent', id, 'settled', 100, 100, NOW(6) - INTERVAL 2 DAY, NOW(6) - INTERVAL 2 DAY FROM users`,
		`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, expires_at)
		 SELECT 'r_live', id, 'running', 100, 100, NOW(6) + INTERVAL 1 HOUR FROM users`,
	} {
		if _, err := db.ExecContext(ctx, q, slices.Repeat([]any{old}, strings.Count(q, "?"))...); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{}, {"-days", "6"}, {"-days", "7", "-batch", "0"}, {"-days", "36601"}, {"-days", "213504"}} {
		if err := pruneCmd(ctx, args); !errors.Is(err, holds.ErrBadFilter) {
			t.Errorf("prune %v: %v, want holds.ErrBadFilter", args, err)
		}
	}
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("dedup:\n  replay_ttl: 240h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pruneCmd(ctx, []string{"-config", cfg, "-days", "8"}); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("prune -days 8 with replay_ttl 10 days: %v, want holds.ErrBadFilter", err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds"); n != 3 {
		t.Fatalf("%d runs after refused prunes, want all 3", n)
	}
	out, err := stdout(t, func() error { return pruneCmd(ctx, []string{"-days", "7"}) })
	if err != nil || !strings.Contains(string(out), "pruned 1 settled runs") {
		t.Fatalf("prune -days 7: %q, %v", out, err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds WHERE run_id IN ('r_recent', 'r_live')"); n != 2 || count("SELECT COUNT(*) FROM run_holds") != 2 {
		t.Errorf("runs left: want r_recent and r_live only")
	}
	testenv.CheckLedger(t, db)
}

// aliceWithANamedRunSettledDaysAgo creates user alice with one named run (X-Run-Id task-1, run
// x_old) settled days ago at 40 µUSD, and its day's ledger row: what prune may delete. It
// returns the test database.
func aliceWithANamedRunSettledDaysAgo(t *testing.T, days int) *sqlx.DB {
	t.Helper()
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	db := openTestDatabase(t)
	at := databaseTimeDaysAgo(t, db, days)
	for _, q := range []string{
		`INSERT INTO run_holds (run_id, user_id, client_run_id, state, held_micro, cap_micro, charged_micro, allowance_part_micro, expires_at, settled_at)
		 SELECT 'x_old', id, 'task-1', 'settled', 100, 100, 40, 40, ?, ? FROM users`,
		`INSERT INTO usage_days (user_id, day, used_micro, run_count) SELECT id, DATE(?), 40, 1 FROM users`,
	} {
		if _, err := db.ExecContext(ctx, q, slices.Repeat([]any{at}, strings.Count(q, "?"))...); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// databaseTimeDaysAgo is the database clock's time days ago, read once: a run's settled_at and
// its ledger row's day taken from two NOW()s fall on two days when midnight passes between
// the statements, and the ledger audit then finds the run's charge on the other day.
func databaseTimeDaysAgo(t *testing.T, db *sqlx.DB, days int) string {
	t.Helper()
	var at string
	if err := db.GetContext(testCtx(t), &at, "SELECT CAST(NOW(6) - INTERVAL ? DAY AS CHAR)", days); err != nil {
		t.Fatalf("database clock %d days ago: %v", days, err)
	}
	return at
}

// TestPruneCommandRefusesACutoffWithinTallyTTL: a run's tally in Redis (billing:usage:{run},
// with its per-call done marks and lost-calls mark) lives holds.tally_ttl from its last call.
// A named run's id is its user and X-Run-Id, so once the run is pruned the same X-Run-Id opens
// a new run under the same id: a tally still alive then was the new run's from its first call,
// and its budget and settlement counted the pruned run's calls again (a one-call run reusing
// an Idempotency-Key's attempt id likewise, when reconciled). The prune refused only cutoffs
// within replay_ttl; one within tally_ttl is refused too, and nothing is deleted.
func TestPruneCommandRefusesACutoffWithinTallyTTL(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	db := aliceWithANamedRunSettledDaysAgo(t, 9)
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte("holds:\n  tally_ttl: 240h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pruneCmd(ctx, []string{"-config", cfg, "-days", "8"}); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("prune -days 8 with tally_ttl 10 days: %v, want holds.ErrBadFilter", err)
	}
	if n := count("SELECT COUNT(*) FROM run_holds"); n != 1 {
		t.Errorf("%d runs after a prune within tally_ttl, want the 1 kept", n)
	}
	testenv.CheckLedger(t, db)
}

// TestGrantRefusalIsWordedInCredits: `gateway grant -amount -500` past the user's prepaid
// credits was refused with "prepaid 100000 micro-USD, grant -500000": the operator, who typed
// credits, read a refund of half a million. The refusal now names the amounts in credits.
func TestGrantRefusalIsWordedInCredits(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stdout(t, func() error {
		return grantCmd(ctx, []string{"-user", "alice", "-amount", "100", "-key", "pay-1"})
	}); err != nil {
		t.Fatal(err)
	}
	_, err := stdout(t, func() error {
		return grantCmd(ctx, []string{"-user", "alice", "-amount", "-500", "-key", "refund-1"})
	})
	if !errors.Is(err, holds.ErrGrantBelowZero) {
		t.Fatalf("refund past zero: %v, want ErrGrantBelowZero", err)
	}
	if msg := err.Error(); strings.Contains(msg, "micro") || !strings.Contains(msg, "-500 credits") || !strings.Contains(msg, "100 credits") {
		t.Errorf("refusal %q: want the refund (-500 credits) and the prepaid credits (100 credits) in credits", msg)
	}
}

// TestDatabaseCommandsRunWithoutRedisURL: the commands that use the database alone run with no
// REDIS_URL set (they refused to start without one they never used).
func TestDatabaseCommandsRunWithoutRedisURL(t *testing.T) {
	count := useTestDatabase(t)
	t.Setenv("REDIS_URL", "")
	if err := run([]string{"user", "create", "-name", "no-redis"}); err != nil {
		t.Fatalf("user create without REDIS_URL: %v", err)
	}
	if n := count("SELECT COUNT(*) FROM users WHERE name = ?", "no-redis"); n != 1 {
		t.Fatalf("%d users named no-redis, want 1", n)
	}
	for _, args := range [][]string{{"balance", "-user", "no-redis"}, {"audit"}} {
		if err := run(args); err != nil {
			t.Errorf("gateway %s without REDIS_URL: %v", strings.Join(args, " "), err)
		}
	}
}

// TestUserCreateUnknownPlanNamesThePlans: `gateway user create -plan gold` answered only
// `unknown plan "gold"`, while `user set` and POST /admin/users name the configured plans; an
// operator on a first day had to open the config to find them.
func TestUserCreateUnknownPlanNamesThePlans(t *testing.T) {
	useTestDatabase(t)
	err := userCreate(testCtx(t), []string{"-name", "bob", "-plan", "gold"})
	if !errors.Is(err, holds.ErrUnknownPlan) || !strings.Contains(err.Error(), "standard") {
		t.Fatalf("user create -plan gold: %v, want ErrUnknownPlan naming the configured plans", err)
	}
}

// TestStoreErrorsNameTheUserTyped: `key revoke -user alice -prefix tg_0000000` answered
// `revoke keys of user 1: prefix "tg_0000000": ...`, and `user set -name alice -plan gold` named
// no user at all: the operator typed a name and never sees ids. Both now name alice.
func TestStoreErrorsNameTheUserTyped(t *testing.T) {
	useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "alice"}); err != nil {
		t.Fatal(err)
	}
	err := keyRevoke(ctx, []string{"-user", "alice", "-prefix", "tg_0000000"})
	if !errors.Is(err, holds.ErrKeyNotFound) || !strings.HasPrefix(err.Error(), "user alice: ") {
		t.Errorf("key revoke of an unknown prefix: %v, want ErrKeyNotFound naming user alice", err)
	}
	err = userSet(ctx, []string{"-name", "alice", "-plan", "gold"})
	if !errors.Is(err, holds.ErrUnknownPlan) || !strings.HasPrefix(err.Error(), "user alice: ") {
		t.Errorf("user set -plan gold: %v, want ErrUnknownPlan naming user alice", err)
	}
}

// TestInstancesCommandPages: `gateway instances` prints the gateway processes' rows as GET
// /admin/instances does, newest start first, and walks them all once by -after.
func TestInstancesCommandPages(t *testing.T) {
	useTestDatabase(t)
	db := openTestDatabase(t)
	names := []string{"gw-old", "gw-mid", "gw-new"}
	for i, name := range names {
		if _, err := db.ExecContext(testCtx(t), `INSERT INTO instances (id, name, started_at, beat_at, max_gap_us, dead_after_us)
			VALUES (?, ?, NOW(6) - INTERVAL ? MINUTE, NOW(6), 25000000, 90000000)`, fmt.Sprintf("%032d", i), name, len(names)-i); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"gw-new", "gw-mid", "gw-old"}
	for limit := 1; limit <= 4; limit++ {
		if got := listPages(t, instancesCmd, nil, limit, "name"); !slices.Equal(got, want) {
			t.Errorf("instances by %d: %v, want %v", limit, got, want)
		}
	}
}

// TestUserCreateNamesTheUserItsNameMatches: user names are compared without regard to case
// (the column's collation), so `user create -name alice` beside a user "Alice" is refused. It
// answered `create user "alice": user exists`, while `user list` shows no alice: the refusal
// now names the user it matched and says why.
func TestUserCreateNamesTheUserItsNameMatches(t *testing.T) {
	count := useTestDatabase(t)
	ctx := testCtx(t)
	if err := userCreate(ctx, []string{"-name", "Alice"}); err != nil {
		t.Fatal(err)
	}
	err := userCreate(ctx, []string{"-name", "alice"})
	if !errors.Is(err, holds.ErrUserExists) || !strings.Contains(err.Error(), `"Alice"`) || !strings.Contains(err.Error(), "case") {
		t.Fatalf("user create -name alice beside Alice: %v, want ErrUserExists naming Alice and the case rule", err)
	}
	if n := count("SELECT COUNT(*) FROM users"); n != 1 {
		t.Fatalf("%d users, want Alice alone", n)
	}
}
