package holds_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// pricingUsage makes up token counts that vary with cost, so the report's token sums are
// checked against something.
func pricingUsage(cost int64) pricing.Usage {
	// With the parts of the totals a provider's invoice lists apart (one-hour cache writes,
	// audio in and out), so the report's sums of them are checked with the rest.
	return pricing.Usage{Input: cost/10 + 1, Output: cost/100 + 1, CacheWrite: cost / 20, CacheWrite1h: cost / 40,
		AudioInput: cost / 30, AudioOutput: cost / 300}
}

// A disabled user is refused at the next admission and by key lookup; enabling restores both.
func TestDisableUserRefusesAtOnce(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("dora", "standard")
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.admit(u, "r_before") // admitted before the switch: runs on and settles
	if changed, err := f.store.DisableUser(f.ctx(), u.ID); err != nil || !changed {
		t.Fatalf("disable: %v, %v", changed, err)
	}
	if changed, err := f.store.DisableUser(f.ctx(), u.ID); err != nil || changed {
		t.Fatalf("disable twice: %v, %v", changed, err)
	}
	if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: "r_after", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute}); !errors.Is(err, holds.ErrUserDisabled) {
		t.Fatalf("admission of a disabled user: %v", err)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); !errors.Is(err, holds.ErrBadKey) {
		t.Fatalf("key of a disabled user: %v", err)
	}
	d, err := f.store.UserDetail(f.ctx(), "dora")
	if err != nil || d.DisabledAt == nil {
		t.Fatalf("detail %+v, %v", d, err)
	}
	f.settle("r_before", 1_000)
	if changed, err := f.store.EnableUser(f.ctx(), u.ID); err != nil || !changed {
		t.Fatalf("enable: %v, %v", changed, err)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("key after enable: %v", err)
	}
	f.admit(u, "r_again")
	f.settle("r_again", 0)
	if _, err := f.store.DisableUser(f.ctx(), 424242); !errors.Is(err, holds.ErrUnknownUser) {
		t.Fatalf("disable unknown user: %v", err)
	}
}

func TestRevokeKeys(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("kim", "standard")
	k1, _ := f.store.CreateKey(f.ctx(), u.ID)
	k2, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if owner, err := f.store.RevokeAPIKey(f.ctx(), k1); err != nil || owner != "kim" {
		t.Fatalf("revoke: %q, %v; want kim's key revoked", owner, err)
	}
	if _, err := f.store.RevokeAPIKey(f.ctx(), k1); !errors.Is(err, holds.ErrKeyNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
	if _, err := f.store.UserByKey(f.ctx(), k1); !errors.Is(err, holds.ErrBadKey) {
		t.Fatalf("revoked key: %v", err)
	}
	keys, err := f.store.ListKeys(f.ctx(), u.ID, 0, 100)
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %+v, %v", keys, err)
	}
	if n, err := f.store.RevokeKeysByPrefix(f.ctx(), u.ID, k2[:10]); err != nil || n != 1 {
		t.Fatalf("revoke by prefix: %d, %v", n, err)
	}
	if _, err := f.store.UserByKey(f.ctx(), k2); !errors.Is(err, holds.ErrBadKey) {
		t.Fatalf("key revoked by prefix: %v", err)
	}
	if _, err := f.store.RevokeKeysByPrefix(f.ctx(), u.ID, "tg_"); !errors.Is(err, holds.ErrBadFilter) {
		t.Fatalf("short prefix: %v", err)
	}
}

func TestListRunsFilters(t *testing.T) {
	f := newAcctFixture(t)
	a, b := f.user("ann", "standard"), f.user("bob", "standard")
	f.admit(a, "r_a1")
	f.settle("r_a1", 1_000)
	f.admit(a, "r_a2")
	f.admit(b, "r_b1")
	if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET created_at = created_at - INTERVAL 2 DAY WHERE run_id = 'r_a1'"); err != nil {
		t.Fatal(err)
	}
	ids := func(f holds.RunFilter, fx *acctFixture) []string {
		t.Helper()
		runs, err := fx.store.ListRuns(fx.ctx(), f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.RunID+"/"+r.UserName)
		}
		return out
	}
	check := func(got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	check(ids(holds.RunFilter{UserID: a.ID, Limit: 10}, f), "r_a2/ann", "r_a1/ann")
	check(ids(holds.RunFilter{State: holds.StateSettled, Limit: 10}, f), "r_a1/ann")
	check(ids(holds.RunFilter{State: holds.StateRunning, Limit: 10}, f), "r_b1/bob", "r_a2/ann")
	check(ids(holds.RunFilter{Until: time.Now().Add(-24 * time.Hour), Limit: 10}, f), "r_a1/ann")
	check(ids(holds.RunFilter{Since: time.Now().Add(-24 * time.Hour), UserID: a.ID, Limit: 10}, f), "r_a2/ann")
	check(ids(holds.RunFilter{Limit: 1, UserID: b.ID}, f), "r_b1/bob")
	// A bad state names the states there are: the operator typing `-state done` learns the word.
	if _, err := f.store.ListRuns(f.ctx(), holds.RunFilter{State: "lost", Limit: 1}); !errors.Is(err, holds.ErrBadFilter) ||
		!strings.Contains(err.Error(), "queued, running or settled") {
		t.Errorf("bad state: %v; want a bad filter naming queued, running or settled", err)
	}
	if _, err := f.store.ListRuns(f.ctx(), holds.RunFilter{Limit: 0}); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("bad limit: %v", err)
	}
	f.settle("r_a2", 0)
	f.settle("r_b1", 2_000)
}

// TestListRunsBySettlementMatchesTheReportDay: the usage report and the day ledger charge a run
// to the UTC day it settled, while since/until select by when it began. A billing team listing
// the runs behind a report day must find there the runs whose charges the day holds — the one
// admitted before midnight and settled after it, a named run settled a day late — and no other.
func TestListRunsBySettlementMatchesTheReportDay(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("night-owl", "standard")
	for _, run := range []string{"r_late", "r_night", "r_day"} {
		f.admit(u, run)
	}
	f.settle("r_late", 3_000)
	f.settle("r_night", 5_000)
	f.settle("r_day", 7_000)
	f.admit(u, "r_open")
	day := time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	for _, m := range []struct {
		run              string
		created, settled time.Time
	}{
		{"r_late", day.Add(-36 * time.Hour), day.Add(2 * time.Hour)},                   // a named run, a day late
		{"r_night", day.Add(-100 * time.Millisecond), day.Add(100 * time.Millisecond)}, // across midnight
		{"r_day", day.Add(-2 * time.Hour), day.Add(-time.Hour)},                        // the day before
	} {
		if _, err := f.db.ExecContext(f.ctx(), "UPDATE run_holds SET created_at = ?, settled_at = ? WHERE run_id = ?", m.created, m.settled, m.run); err != nil {
			t.Fatal(err)
		}
	}
	// The ledger follows the runs to the days they now settled on, so the books still balance.
	if _, err := f.db.ExecContext(f.ctx(), "DELETE FROM usage_days WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES (?, '2026-03-07', 7000, 1), (?, '2026-03-08', 8000, 2)", u.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	list := func(rf holds.RunFilter) []string {
		t.Helper()
		runs, err := f.store.ListRuns(f.ctx(), rf)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.RunID)
		}
		return out
	}
	check := func(got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	next := day.Add(24 * time.Hour)
	check(list(holds.RunFilter{SettledSince: day, SettledUntil: next, Limit: 10}), "r_late", "r_night")
	check(list(holds.RunFilter{SettledSince: day, SettledUntil: next, State: holds.StateSettled, UserID: u.ID, Limit: 10}), "r_late", "r_night")
	check(list(holds.RunFilter{SettledUntil: day, Limit: 10}), "r_day")
	check(list(holds.RunFilter{SettledSince: day, Limit: 1}), "r_late")
	check(list(holds.RunFilter{SettledSince: day, After: "r_late", Limit: 10}), "r_night")
	// By when they began, the same day holds another set: the listing the report disagreed with.
	check(list(holds.RunFilter{Since: day.Add(-24 * time.Hour), Until: day, State: holds.StateSettled, Limit: 10}), "r_night", "r_day")

	rep, err := f.store.Usage(f.ctx(), day, day, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	reported, listed := rep.Totals.ChargedMicro, int64(0)
	runs, err := f.store.ListRuns(f.ctx(), holds.RunFilter{SettledSince: day, SettledUntil: next, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		listed += r.ChargedMicro
	}
	if reported != listed || listed != 8_000 || rep.LedgerMicro != 8_000 {
		t.Errorf("report day charges %d (ledger %d), its listed runs %d; want 8000 each", reported, rep.LedgerMicro, listed)
	}

	if _, err := f.store.ListRuns(f.ctx(), holds.RunFilter{SettledSince: day, State: holds.StateRunning, Limit: 1}); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("a settlement window over running runs: %v, want ErrBadFilter", err)
	}
	if _, err := f.store.ListRuns(f.ctx(), holds.RunFilter{SettledSince: day, After: "r_open", Limit: 1}); !errors.Is(err, holds.ErrBadAfter) {
		t.Errorf("a settlement listing paged after an unsettled run: %v, want ErrBadAfter", err)
	}
	f.settle("r_open", 0)
}

// The usage report's totals equal the day ledger and the sum of the settled holds, per user
// and day and overall, across models, days, releases at 0 and charges into prepaid.
func TestUsageReportEqualsLedgerAndSettledHolds(t *testing.T) {
	f := newAcctFixture(t)
	a, b := f.user("alpha", "standard"), f.user("beta", "guest")
	f.grant(b, 200_000, "b-topup")
	n := 0
	settle := func(u holds.User, model string, cost int64) {
		n++
		id := fmt.Sprintf("r_%d", n)
		if _, err := f.store.Admit(f.ctx(), holds.AdmitRequest{RunID: id, UserID: u.ID, Model: model, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Settle(f.ctx(), holds.Settlement{RunID: id, CostMicro: cost, Calls: 2,
			Usage: pricingUsage(cost), Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	settle(a, "gpt-a", 1_234)
	settle(a, "gpt-b", 5_000)
	settle(a, "gpt-a", 0) // a release: counted as a run, not in the ledger's run_count
	settle(b, "gpt-a", 40_000)
	settle(b, "gpt-a", 45_000) // guest cap 50000, 25% off: 33750, crossing the 100000 allowance later
	settle(b, "gpt-b", 50_000)
	settle(b, "gpt-b", 50_000) // into prepaid
	// Move a's first day back: yesterday's runs and ledger together.
	for _, q := range []string{
		"UPDATE run_holds SET settled_at = settled_at - INTERVAL 1 DAY WHERE user_id = ? AND run_id IN ('r_1', 'r_2')",
		"UPDATE usage_days SET day = day - INTERVAL 1 DAY WHERE user_id = ?",
	} {
		if _, err := f.db.ExecContext(f.ctx(), q, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	settle(a, "gpt-a", 7_000) // today
	// The day the calls settled on, not UTC_DATE(): midnight may have passed since.
	today, err := testenv.SettledDay(f.ctx(), f.db, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -1), today, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Per user and day, from the report's rows and from the database independently.
	type ud struct {
		user uint64
		day  string
	}
	fromReport := map[ud]int64{}
	runsFromReport := map[ud]int64{}
	for _, r := range rep.Rows {
		fromReport[ud{r.UserID, r.Day}] += r.ChargedMicro
		runsFromReport[ud{r.UserID, r.Day}] += r.ChargedRuns
		if r.AllowancePartMicro+r.PrepaidPartMicro != r.ChargedMicro {
			t.Errorf("row %+v: parts do not add up", r)
		}
	}
	var ledger []struct {
		User uint64 `db:"user_id"`
		Day  string `db:"day"`
		Used int64  `db:"used_micro"`
		Runs int64  `db:"run_count"`
	}
	if err := f.db.SelectContext(f.ctx(), &ledger, "SELECT user_id, DATE_FORMAT(day, '%Y-%m-%d') AS day, used_micro, run_count FROM usage_days"); err != nil {
		t.Fatal(err)
	}
	if len(ledger) != 3 || len(fromReport) != 3 {
		t.Fatalf("ledger %+v, report %+v: want three user-days", ledger, fromReport)
	}
	for _, l := range ledger {
		k := ud{l.User, l.Day}
		if fromReport[k] != l.Used || runsFromReport[k] != l.Runs {
			t.Errorf("user %d on %s: report %d in %d runs, ledger %d in %d runs", l.User, l.Day, fromReport[k], runsFromReport[k], l.Used, l.Runs)
		}
	}
	var settled struct {
		Charged int64 `db:"charged"`
		Runs    int64 `db:"runs"`
		Tok     int64 `db:"tok"`
	}
	if err := f.db.GetContext(f.ctx(), &settled, "SELECT SUM(charged_micro) AS charged, COUNT(*) AS runs, SUM(in_tok + out_tok) AS tok FROM run_holds WHERE state = 'settled'"); err != nil {
		t.Fatal(err)
	}
	if rep.Totals.ChargedMicro != settled.Charged || rep.Totals.Runs != settled.Runs || rep.Totals.InTok+rep.Totals.OutTok != settled.Tok {
		t.Errorf("totals %+v, settled holds %+v", rep.Totals, settled)
	}
	if rep.LedgerMicro != rep.Totals.ChargedMicro || rep.LedgerRuns != rep.Totals.ChargedRuns {
		t.Errorf("report ledger %d/%d, totals %d/%d", rep.LedgerMicro, rep.LedgerRuns, rep.Totals.ChargedMicro, rep.Totals.ChargedRuns)
	}
	if rep.Totals.PrepaidPartMicro == 0 {
		t.Errorf("no charge reached prepaid: %+v", rep.Totals)
	}
	if len(rep.Rows) != 5 { // alpha: yesterday a, yesterday b, today a(2 runs); beta: today a, today b
		t.Errorf("%d rows: %+v", len(rep.Rows), rep.Rows)
	}
	// One user, one day.
	only, err := f.store.Usage(f.ctx(), today, today, a.ID)
	if err != nil || len(only.Rows) != 1 || only.Totals.ChargedMicro != 7_000 || only.LedgerMicro != 7_000 || only.Totals.Runs != 2 {
		t.Fatalf("alpha today: %+v, %v", only, err)
	}
	if _, err := f.store.Usage(f.ctx(), today, today.AddDate(0, 0, -1), 0); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("reversed range: %v", err)
	}
	if _, err := f.store.Usage(f.ctx(), today.AddDate(-2, 0, 0), today, 0); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("two-year range: %v", err)
	}
	// A report past its row bound is refused whole, never cut short: its totals would lie.
	defer holds.SetMaxReportRows(4)()
	if rep, err := f.store.Usage(f.ctx(), today.AddDate(0, 0, -1), today, 0); !errors.Is(err, holds.ErrBadFilter) {
		t.Errorf("5 rows under a bound of 4: %d rows, %v; want ErrBadFilter", len(rep.Rows), err)
	}
	if _, err := f.store.Usage(f.ctx(), today, today, a.ID); err != nil {
		t.Errorf("1 row under a bound of 4: %v", err)
	}
}

// TestRevokeByPartOfAPrefixSaysWhatAPrefixIs: a prefix is compared whole, so the first 7–9
// characters of the 10 that `key list` shows matched nothing and were answered "no live key
// with that value" (404 key_not_found): the operator read the key as already revoked while it
// stayed live. Anything but the whole prefix is now refused as such, naming its length.
func TestRevokeByPartOfAPrefixSaysWhatAPrefixIs(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("kim", "standard")
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{key[:7], key[:9], key[:11], "tg_"} {
		_, err := f.store.RevokeKeysByPrefix(f.ctx(), u.ID, p)
		if !errors.Is(err, holds.ErrBadFilter) || !strings.Contains(err.Error(), "10 characters") {
			t.Errorf("revoke by prefix %q: %v, want ErrBadFilter naming the prefix's 10 characters", p, err)
		}
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("the key should still be live: %v", err)
	}
}

// TestRevokeByPrefixComparesCase: a key's prefix is case-sensitive (tg_aB3… and tg_Ab3… are
// two keys), but the column's collation compared it without case: revoking one of a user's
// keys by its prefix revoked any other whose prefix differed only in case.
func TestRevokeByPrefixComparesCase(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("kim", "standard")
	var key, other string
	for other == "" {
		k, err := f.store.CreateKey(f.ctx(), u.ID)
		if err != nil {
			t.Fatal(err)
		}
		key, other = k, holds.KeyPrefix+swapCase(holds.ShownPrefix(k)[len(holds.KeyPrefix):])
		if other == holds.ShownPrefix(k) {
			other = "" // no letter to change the case of: try another key
		}
	}
	if _, err := f.store.RevokeKeysByPrefix(f.ctx(), u.ID, other); !errors.Is(err, holds.ErrKeyNotFound) {
		t.Fatalf("revoke by prefix %q of key %s…: %v, want ErrKeyNotFound", other, holds.ShownPrefix(key), err)
	}
	if _, err := f.store.UserByKey(f.ctx(), key); err != nil {
		t.Fatalf("the key should still be live: %v", err)
	}
}

// swapCase turns s's upper-case ASCII letters to lower case and its lower-case ones to upper.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// TestRevokeKeyOfADeletedUser: a key whose user row is gone (deleted by hand; the store keeps
// no foreign keys) is still a live key: a user restored under the same id, from a backup,
// would authenticate with it again. Revoking it named its user by a join that found no user
// and answered ErrKeyNotFound ("no live key with that value"), leaving the key live.
func TestRevokeKeyOfADeletedUser(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("gone", "standard")
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(f.ctx(), "DELETE FROM users WHERE id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if owner, err := f.store.RevokeAPIKey(f.ctx(), key); err != nil || owner != "" {
		t.Fatalf("revoke a deleted user's key: %q, %v; want it revoked, its user unnamed", owner, err)
	}
	var live int
	if err := f.db.GetContext(f.ctx(), &live, "SELECT COUNT(*) FROM api_keys WHERE user_id = ? AND revoked_at IS NULL", u.ID); err != nil || live != 0 {
		t.Fatalf("%d live keys of the deleted user (%v), want 0", live, err)
	}
}
