package sql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
	tgsql "github.com/tollgate/tollgate/sql"
)

// mapTally is a Redis tally that holds the runs it was given: the old gateways' tallies, which
// the new reconciler reads (README § Upgrading: same key names and formats).
type mapTally map[string]holds.RunTally

func (m mapTally) Tallied(_ context.Context, runID string) (holds.RunTally, bool, error) {
	t, ok := m[runID]
	return t, ok, nil
}

type noLeases struct{}

func (noLeases) Exists(context.Context, string) (bool, error) { return false, nil }

type alwaysLock struct{}

func (alwaysLock) TryLock(context.Context) (bool, error) { return true, nil }

// moneyAtLevel writes, with the columns of migration 001 alone (every later one only adds),
// and 012's pruned_runs when the level has it, the books an older fleet leaves: grants over
// several days, settled runs whose charges split between allowance and prepaid, their day
// ledger, and live holds its gateways admitted (one expired and tallied, one queued, one whose
// usage was lost, a named run, one not yet expired). It returns the users' ids.
func moneyAtLevel(t *testing.T, db *sqlx.DB, level int) (a, b uint64) {
	t.Helper()
	exec := func(q string, args ...any) int64 {
		t.Helper()
		res, err := db.Exec(q, args...)
		if err != nil {
			t.Fatalf("level %d: %q: %v", level, q, err)
		}
		id, _ := res.LastInsertId()
		return id
	}
	a = uint64(exec("INSERT INTO users (name, plan, prepaid_micro) VALUES ('payg', 'standard', ?)", 0))
	b = uint64(exec("INSERT INTO users (name, plan, allowance_micro, discount_bp) VALUES ('team', 'standard', 3000000, 1000)"))
	day := func(d int) string { return fmt.Sprintf("UTC_DATE() - INTERVAL %d DAY + INTERVAL 12 HOUR", d) }
	grant := func(user uint64, d int, amount int64, key string) {
		exec("INSERT INTO grants (user_id, amount_micro, balance_after_micro, idempotency_key, reason, created_at) VALUES (?, ?, 0, ?, 'pay', "+day(d)+")",
			user, amount, key)
	}
	grant(a, 3, 5_000_000, "evt_1")
	grant(a, 1, 2_000_000, "evt_2")
	grant(a, 1, -500_000, "refund_evt_1")
	settled := func(user uint64, id string, d int, cost, charged, allowance, prepaid int64, discount int) {
		exec(`INSERT INTO run_holds (run_id, user_id, state, held_micro, cap_micro, cost_micro, charged_micro,
			allowance_part_micro, prepaid_part_micro, in_tok, out_tok, calls, model, discount_bp, settle_source,
			expires_at, created_at, settled_at)
			VALUES (?, ?, 'settled', 2000000, 2000000, ?, ?, ?, ?, 100, 50, 1, 'm', ?, 'complete', `+day(d)+`, `+day(d)+`, `+day(d)+`)`,
			id, user, cost, charged, allowance, prepaid, discount)
	}
	settled(a, "s_a3", 3, 800_000, 800_000, 800_000, 0, 0)
	settled(a, "s_a2", 2, 1_500_000, 1_500_000, 1_000_000, 500_000, 0)
	settled(a, "s_a1", 1, 300_000, 300_000, 300_000, 0, 0)
	settled(a, "s_a1_free", 1, 0, 0, 0, 0, 0)
	settled(a, "s_a0", 0, 1_200_000, 1_200_000, 1_000_000, 200_000, 0)
	settled(b, "s_b0", 0, 500_000, 450_000, 450_000, 0, 1000)
	ledger := func(user uint64, d int, used int64, runs int) {
		exec(fmt.Sprintf("INSERT INTO usage_days (user_id, day, used_micro, run_count) VALUES (?, UTC_DATE() - INTERVAL %d DAY, ?, ?)", d), user, used, runs)
	}
	ledger(a, 3, 800_000, 1)
	ledger(a, 2, 1_500_000, 1)
	ledger(a, 1, 300_000, 1)
	ledger(a, 0, 1_200_000, 1)
	ledger(b, 0, 450_000, 1)
	prepaid := int64(5_000_000 + 2_000_000 - 500_000 - 500_000 - 200_000)
	if level >= 12 {
		// A run `gateway prune` folded into its sums 40 days ago.
		exec(`INSERT INTO pruned_runs (user_id, day, model, runs, charged_runs, calls, in_tok, out_tok, cost_micro,
			charged_micro, allowance_part_micro, prepaid_part_micro)
			VALUES (?, UTC_DATE() - INTERVAL 40 DAY, 'm', 1, 1, 1, 10, 10, 700000, 700000, 600000, 100000)`, a)
		ledger(a, 40, 700_000, 1)
		grant(a, 41, 100_000, "evt_0")
	}
	exec("UPDATE users SET prepaid_micro = ? WHERE id = ?", prepaid, a)
	live := func(id, state, clientRun string, held, cost int64, calls int, expiresIn time.Duration) {
		exec(`INSERT INTO run_holds (run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro, calls,
			model, discount_bp, expires_at) VALUES (?, ?, NULLIF(?, ''), ?, ?, ?, ?, ?, 'm', 0, NOW(6) + INTERVAL ? MICROSECOND)`,
			id, a, clientRun, state, held, held, cost, calls, expiresIn.Microseconds())
	}
	live("h_tally", "running", "", 400_000, 0, 0, -10*time.Minute)
	live("h_queued", "queued", "", 300_000, 0, 0, -10*time.Minute)
	live("h_lost", "running", "", 250_000, 0, 0, -10*time.Minute)
	live("h_named", "running", "task", 500_000, 90_000, 2, -10*time.Minute)
	// A named run whose calls an old gateway recorded on its row, its tally lost (a Redis
	// restart): settled from the row, not at its hold.
	live("h_named_row", "running", "task2", 600_000, 70_000, 3, -10*time.Minute)
	live("h_live", "running", "", 100_000, 0, 0, time.Hour)
	return a, b
}

// TestUpgradeFromEveryLevelKeepsTheBooks: an operator upgrades a fleet whose database stands
// at any older migration, with money in it. After `gateway migrate` the books must read as
// before — the audit clean, each user's balance the same figure for figure — and the holds the
// old gateways admitted must settle exactly once by the new reconciler, each charge split so
// that prepaid is still Σ grants − Σ prepaid parts.
func TestUpgradeFromEveryLevelKeepsTheBooks(t *testing.T) {
	ctx := context.Background()
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	plans := map[string]holds.Plan{"standard": {AllowanceMicro: 1_000_000, HoldNormalMicro: 100_000}}
	for level := 1; level < len(all); level++ {
		t.Run(fmt.Sprintf("from_%03d", level), func(t *testing.T) {
			db := emptyDB(t)
			if _, err := tgsql.MigrateTo(ctx, db.DB, level); err != nil {
				t.Fatal(err)
			}
			a, b := moneyAtLevel(t, db, level)
			store := holds.NewStore(db, plans, "standard", zap.NewNop())
			before := map[uint64]holds.Balance{}
			for _, u := range []uint64{a, b} {
				bal, err := store.Balance(ctx, u)
				if err != nil {
					t.Fatalf("balance of %d at level %d: %v", u, level, err)
				}
				before[u] = bal
			}

			if done, err := tgsql.Migrate(ctx, db.DB); err != nil || len(done) != len(all)-level {
				t.Fatalf("migrate from %d: applied %v, %v", level, done, err)
			}
			checkAudit(t, ctx, db, "after the migration")
			for _, u := range []uint64{a, b} {
				bal, err := store.Balance(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				if bal != before[u] {
					t.Fatalf("user %d's balance changed with the migration from %d:\nbefore %+v\nafter  %+v", u, level, before[u], bal)
				}
			}

			tally := mapTally{
				"h_tally": {Usage: pricing.Usage{Input: 1000, Output: 200}, CostMicro: 150_000, Calls: 1},
				"h_named": {Usage: pricing.Usage{Input: 900, Output: 90}, CostMicro: 90_000, Calls: 2},
			}
			rec := holds.NewReconciler(holds.ReconcilerConfig{Store: store, Usage: tally, Leases: noLeases{},
				Lock: alwaysLock{}, Log: zap.NewNop(), ExtendBy: time.Minute, Interval: time.Minute})
			// Two reconcilers at once, as two new gateways' passes may overlap: each hold
			// settles once.
			var wg sync.WaitGroup
			stats := make([]holds.Stats, 2)
			errs := make([]error, 2)
			for i := range stats {
				wg.Add(1)
				go func() { defer wg.Done(); stats[i], errs[i] = rec.RunForced(ctx) }()
			}
			wg.Wait()
			var fromTally, released, chargedHeld int
			var charged int64
			for i, st := range stats {
				if errs[i] != nil || st.Errors != 0 {
					t.Fatalf("reconcile pass %d after the upgrade: %+v, %v", i, st, errs[i])
				}
				fromTally += st.FromTally
				released += st.Released
				chargedHeld += st.ChargedHeld
				charged += st.ChargedMicro
			}
			if fromTally != 3 || released != 1 || chargedHeld != 1 || charged != 150_000+90_000+70_000+250_000 {
				t.Fatalf("the old gateways' expired holds after the upgrade: %d from the tally or row, %d released, %d charged held, %d µUSD charged; want 3, 1, 1, %d",
					fromTally, released, chargedHeld, charged, 150_000+90_000+70_000+250_000)
			}
			if st, err := rec.RunForced(ctx); err != nil || st.ChargedMicro != 0 || st.FromTally+st.Released+st.ChargedHeld != 0 {
				t.Fatalf("a later pass settled again: %+v, %v", st, err)
			}
			checkAudit(t, ctx, db, "after the reconciler")
			after, err := store.Balance(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			// The day's allowance was spent: each charge came out of prepaid.
			want := before[a]
			want.UsedTodayMicro += 560_000
			want.PrepaidMicro -= 560_000
			want.HeldMicro, want.InFlight, want.SpentInRunsMicro = 100_000, 1, 0
			want.AvailableMicro = holds.Available(want.AllowanceMicro, want.UsedTodayMicro, want.PrepaidMicro, want.HeldMicro)
			if after != want {
				t.Fatalf("balance after the old holds settled:\n got %+v\nwant %+v", after, want)
			}
			var state string
			if err := db.Get(&state, "SELECT state FROM run_holds WHERE run_id = 'h_live'"); err != nil || state != "running" {
				t.Fatalf("the hold not yet expired: %q, %v; want it left running", state, err)
			}
		})
	}
}

func checkAudit(t *testing.T, ctx context.Context, db *sqlx.DB, when string) {
	t.Helper()
	bad, err := holds.Audit(ctx, db)
	if err != nil {
		t.Fatalf("audit %s: %v", when, err)
	}
	for _, m := range bad {
		t.Errorf("audit %s: %s", when, m)
	}
	if len(bad) > 0 {
		t.FailNow()
	}
}

// TestAddedColumnsLetOldStatementsInsert: the rolling upgrade rests on every column a
// migration adds to an existing table being nullable, defaulted or AUTO_INCREMENT, so that
// the INSERTs of the gateways still serving at the schema before it (which name their
// columns, and not the new one) go on working and leave a value the new code reads as "not
// recorded" (README § Upgrading). 011 and 014 are tested with the old statements themselves;
// this holds every migration to the rule, the future ones too.
func TestAddedColumnsLetOldStatementsInsert(t *testing.T) {
	ctx := context.Background()
	all, err := tgsql.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	db := emptyDB(t)
	type column struct {
		Table    string         `db:"table_name"`
		Name     string         `db:"column_name"`
		Nullable string         `db:"is_nullable"`
		Default  sql.NullString `db:"column_default"`
		Extra    string         `db:"extra"`
	}
	columns := func() map[string]column {
		var cs []column
		if err := db.Select(&cs, `SELECT table_name, column_name, is_nullable, column_default, extra
			FROM information_schema.columns WHERE table_schema = DATABASE()`); err != nil {
			t.Fatal(err)
		}
		out := map[string]column{}
		for _, c := range cs {
			out[c.Table+"."+c.Name] = c
		}
		return out
	}
	tables := func(cs map[string]column) map[string]bool {
		out := map[string]bool{}
		for _, c := range cs {
			out[c.Table] = true
		}
		return out
	}
	before := map[string]column{}
	added := 0
	for _, m := range all {
		if _, err := tgsql.MigrateTo(ctx, db.DB, m.Version); err != nil {
			t.Fatalf("apply %s: %v", m.Name, err)
		}
		after := columns()
		existed := tables(before)
		for key, c := range after {
			if !existed[c.Table] || c.Table == "schema_migrations" {
				continue
			}
			old, had := before[key]
			insertable := c.Nullable == "YES" || c.Default.Valid || strings.Contains(c.Extra, "auto_increment")
			if !had {
				added++
			}
			if !had && !insertable {
				t.Errorf("%s adds %s NOT NULL without a default: an INSERT of a gateway still at the schema before it fails", m.Name, key)
			}
			if had && old.Nullable == "YES" && c.Nullable == "NO" {
				t.Errorf("%s makes %s NOT NULL: a gateway still at the schema before it may write NULL there", m.Name, key)
			}
			if had && (old.Default.Valid || old.Nullable == "YES") && !insertable {
				t.Errorf("%s drops %s's default: an INSERT of a gateway still at the schema before it that leaves it out fails", m.Name, key)
			}
		}
		for key := range before {
			if _, ok := after[key]; !ok {
				t.Errorf("%s drops %s, which the gateways still at the schema before it name", m.Name, key)
			}
		}
		before = after
	}
	if added < 10 {
		t.Fatalf("%d added columns found: the column listing is wrong", added)
	}
}
