package holds_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/internal/token"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// newClockedEnv is a storeEnv on a fresh database whose own handle reads the database clock
// standing still at checkAt (the ledger check at cleanup runs there), and a maker of stores on
// the same database whose clock stands still at another instant (openAt).
func newClockedEnv(t *testing.T, checkAt time.Time) (*storeEnv, func(time.Time) *holds.Store) {
	t.Helper()
	dsn := testenv.MySQLDSN(t)
	e := &storeEnv{t: t}
	var prefix string
	e.rdb, prefix = testenv.Redis(t)
	e.keys = runstate.Keys{Prefix: prefix}
	e.log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	e.tally = runstate.NewTally(e.rdb, e.keys, time.Hour)
	e.db = openAt(t, dsn, checkAt)
	e.store = holds.NewStore(e.db, testPlans(), "standard", e.log)
	t.Cleanup(func() { testenv.CheckLedger(t, e.db) })
	return e, func(at time.Time) *holds.Store {
		return holds.NewStore(openAt(t, dsn, at), testPlans(), "standard", e.log)
	}
}

// TestHoldExpiringAtMidnightIsReconciledOnTheNewDay: a call admitted at 23:45 with a 15-minute
// TTL expires at exactly 00:00:00.000000. At that instant it no longer takes an in-flight slot
// (in flight is expires_at > now) yet still counts as held, and the reconciler leaves it (it
// reads expires_at < NOW(6), DESIGN §5), so it is neither in flight nor settled then. One
// microsecond later the reconciler settles it from its tally, on the new day's ledger and
// allowance (DESIGN §3: the UTC day of settlement), and the day ledger equals the charges.
func TestHoldExpiringAtMidnightIsReconciledOnTheNewDay(t *testing.T) {
	midnight := time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	e, at := newClockedEnv(t, midnight.Add(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eve := at(midnight.Add(-15 * time.Minute))
	u, err := eve.CreateUser(ctx, "expiry-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	if err := eve.SetUserLimits(ctx, u.ID, nil, &one, nil); err != nil {
		t.Fatal(err)
	}
	h, err := eve.Admit(ctx, holds.AdmitRequest{RunID: "r_mid", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: 15 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.addTally(h.RunID, pricing.Usage{Input: 100, Output: 10}, 7_000)

	atExpiry := at(midnight)
	if r, err := atExpiry.Run(ctx, u.ID, h.RunID); err != nil || !r.ExpiresAt.Equal(midnight) {
		t.Fatalf("hold expires at %v, %v; want exactly %v", r.ExpiresAt, err, midnight)
	}
	b, err := atExpiry.Balance(ctx, u.ID)
	if err != nil || b.InFlight != 0 || b.HeldMicro != h.HeldMicro || b.Day.Format(time.DateOnly) != "2026-03-08" {
		t.Fatalf("balance at exactly the expiry: %+v, %v; want nothing in flight, %d still held, day 2026-03-08", b, err, h.HeldMicro)
	}
	// Its slot is free: with max_in_flight 1 another call is admitted at that instant.
	if _, err := atExpiry.Admit(ctx, holds.AdmitRequest{RunID: "r_next", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning,
		TTL: 15 * time.Minute}); err != nil {
		t.Fatalf("admission at exactly the expiry of the only hold in flight: %v", err)
	}
	pass := func(st *holds.Store) holds.Stats {
		t.Helper()
		e.store = st
		s, err := e.pass(e.reconciler("me", nil))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := pass(atExpiry); s.Scanned != 0 {
		t.Fatalf("reconcile pass at exactly the expiry: %+v; want nothing scanned (expires_at < now)", s)
	}
	after := at(midnight.Add(time.Microsecond))
	if s := pass(after); s.Scanned != 1 || s.FromTally != 1 || s.ChargedMicro != 7_000 {
		t.Fatalf("reconcile pass 1µs after the expiry: %+v; want r_mid settled from its tally at 7000", s)
	}
	r, err := after.Run(ctx, u.ID, h.RunID)
	if err != nil || r.SettleSource.String != holds.SourceReconcile || r.AllowancePart != 7_000 ||
		!r.SettledAt.Valid || !r.SettledAt.Time.Equal(midnight.Add(time.Microsecond)) {
		t.Fatalf("reconciled run %+v, %v; want settled at 00:00:00.000001 from the new day's allowance", r, err)
	}
	rep, err := after.Usage(ctx, midnight.AddDate(0, 0, -1), midnight, u.ID)
	if err != nil || len(rep.Rows) != 1 || rep.Rows[0].Day != "2026-03-08" || rep.Totals.ChargedMicro != 7_000 ||
		rep.LedgerMicro != 7_000 {
		t.Fatalf("usage report over both days: %+v, %v; want one row on 2026-03-08 charging 7000, equal to the ledger", rep, err)
	}
	if _, err := after.Settle(ctx, holds.Settlement{RunID: "r_next", Source: holds.SourceRelease}); err != nil {
		t.Fatal(err)
	}
}

// TestNamedRunAcrossMidnightIsChargedOnTheSettlementDay: a named run opened at 23:59 whose call
// used 300 credits that evening is owed on both sides of midnight — held against the old day's
// balance and the new day's — and is charged, when its client settles it the next morning, to
// the new day's ledger and allowance alone; a later call after midnight reuses its hold. The
// old day's ledger has nothing of it, and the usage report of both days equals the ledger.
func TestNamedRunAcrossMidnightIsChargedOnTheSettlementDay(t *testing.T) {
	midnight := time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC)
	e, at := newClockedEnv(t, midnight.Add(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eve, morning := at(midnight.Add(-time.Minute)), at(midnight.Add(30*time.Second))
	u, err := eve.CreateUser(ctx, "run-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	open := holds.AdmitRequest{RunID: "r_task", ClientRunID: "task", UserID: u.ID, Model: "fake-gpt", State: holds.StateQueued,
		TTL: 15 * time.Minute}
	h, err := eve.Admit(ctx, open)
	if err != nil {
		t.Fatal(err)
	}
	const spent = 300_000
	if ok, err := eve.RecordRunCall(ctx, h.RunID, token.New(), 15*time.Minute, pricing.Usage{Input: 1000, Output: 100}, spent, 1, false); err != nil || !ok {
		t.Fatalf("record the evening's call: %v, %v", ok, err)
	}
	for _, side := range []struct {
		st  *holds.Store
		day string
	}{{eve, "2026-03-07"}, {morning, "2026-03-08"}} {
		b, err := side.st.Balance(ctx, u.ID)
		if err != nil || b.Day.Format(time.DateOnly) != side.day || b.UsedTodayMicro != 0 || b.HeldMicro != spent ||
			b.SpentInRunsMicro != spent || b.AvailableMicro != testAllowance-spent {
			t.Fatalf("balance on %s with the run open: %+v, %v; want nothing used, %d held and spent in runs, %d available",
				side.day, b, err, spent, testAllowance-spent)
		}
	}
	open.State = holds.StateRunning
	if again, err := morning.Admit(ctx, open); err != nil || !again.Existing || again.RecordedMicro != spent {
		t.Fatalf("the run's call after midnight: %+v, %v; want its hold reused, %d recorded", again, err, spent)
	}
	res, err := morning.Settle(ctx, holds.Settlement{RunID: h.RunID, CostMicro: spent, Calls: 1, Model: "fake-gpt",
		Usage: pricing.Usage{Input: 1000, Output: 100}, Source: holds.SourceClient})
	if err != nil || !res.Applied || res.ChargedMicro != spent || res.AllowancePart != spent || res.PrepaidPart != 0 {
		t.Fatalf("settle the next morning: %+v, %v; want %d from the new day's allowance", res, err, spent)
	}
	var days []struct {
		Day  string `db:"day"`
		Used int64  `db:"used_micro"`
	}
	if err := e.db.SelectContext(ctx, &days, "SELECT DATE_FORMAT(day, '%Y-%m-%d') AS day, used_micro FROM usage_days WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	if len(days) != 1 || days[0].Day != "2026-03-08" || days[0].Used != spent {
		t.Fatalf("day ledger %+v; want only 2026-03-08 at %d", days, spent)
	}
	rep, err := morning.Usage(ctx, midnight.AddDate(0, 0, -1), midnight, u.ID)
	if err != nil || len(rep.Rows) != 1 || rep.Rows[0].Day != "2026-03-08" || rep.Totals.ChargedMicro != spent ||
		rep.LedgerMicro != spent || rep.Totals.AllowancePartMicro != spent {
		t.Fatalf("usage report over both days: %+v, %v; want one row on 2026-03-08 charging %d, equal to the ledger", rep, err, spent)
	}
}
