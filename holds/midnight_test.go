package holds_test

import (
	"context"
	"fmt"
	"testing"
	"time"
	_ "time/tzdata" // Asia/Tokyo below whether or not the box has a zone database

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// openAt opens dsn with the database clock of every session standing still at at (the
// driver sends SET timestamp): how a test puts the database on either side of midnight.
func openAt(t *testing.T, dsn string, at time.Time) *sqlx.DB {
	t.Helper()
	db := testenv.Open(t, testenv.DSNAt(t, dsn, at))
	return db
}

// TestChargeAcrossMidnightLandsOnTheSettlementDay: a call admitted at 23:59:59.9 and settled
// at 00:00:00.1 (DESIGN §3: "the day a charge lands on is the UTC day of settlement") is
// charged to the new day's ledger and allowance, whatever the old day had left when it was
// admitted; its hold, admitted before midnight, is still live and held after it; and the
// balance of each side shows its own day.
func TestChargeAcrossMidnightLandsOnTheSettlementDay(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	eve := time.Date(2026, 3, 7, 23, 59, 59, 900_000_000, time.UTC)
	morning := time.Date(2026, 3, 8, 0, 0, 0, 100_000_000, time.UTC)
	dbEve, dbMorning := openAt(t, dsn, eve), openAt(t, dsn, morning)
	before := holds.NewStore(dbEve, settlePlans, "standard", zap.NewNop())
	after := holds.NewStore(dbMorning, settlePlans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, dbMorning) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	u, err := before.CreateUser(ctx, "midnight-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	allowance := int64(30_000)
	if err := before.SetUserLimits(ctx, u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	admit := func(runID string) holds.Hold {
		t.Helper()
		h, err := before.Admit(ctx, holds.AdmitRequest{RunID: runID, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute})
		if err != nil {
			t.Fatalf("admit %s: %v", runID, err)
		}
		return h
	}
	admit("r_eve")
	if res, err := before.Settle(ctx, holds.Settlement{RunID: "r_eve", CostMicro: 25_000, Source: holds.SourceComplete}); err != nil || res.AllowancePart != 25_000 {
		t.Fatalf("settle before midnight: %+v, %v", res, err)
	}
	late := admit("r_late") // the old day has 5000 left
	if late.HeldMicro != 5_000 || late.CapMicro != 5_000 {
		t.Fatalf("hold admitted at 23:59:59.9: %+v, want held and cap 5000 (the old day's rest)", late)
	}

	b, err := after.Balance(ctx, u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Day.Format(time.DateOnly) != "2026-03-08" || b.UsedTodayMicro != 0 || b.HeldMicro != 5_000 || b.InFlight != 1 ||
		b.AvailableMicro != 25_000 {
		t.Fatalf("balance at 00:00:00.1 with the hold of 23:59:59.9 live: %+v; want day 2026-03-08, nothing used, 5000 held, 1 in flight, 25000 available", b)
	}

	res, err := after.Settle(ctx, holds.Settlement{RunID: "r_late", CostMicro: 5_000, Source: holds.SourceComplete})
	if err != nil || !res.Applied || res.AllowancePart != 5_000 || res.PrepaidPart != 0 {
		t.Fatalf("settle after midnight: %+v, %v; want 5000 from the new day's allowance", res, err)
	}
	r, err := after.Run(ctx, u.ID, "r_late")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.SettledAt.Time.Format(time.RFC3339Nano); got != "2026-03-08T00:00:00.1Z" {
		t.Errorf("settled_at = %s, want the settlement's database time 2026-03-08T00:00:00.1Z", got)
	}
	var days []struct {
		Day  string `db:"day"`
		Used int64  `db:"used_micro"`
		Runs int64  `db:"run_count"`
	}
	if err := dbMorning.SelectContext(ctx, &days, "SELECT DATE_FORMAT(day, '%Y-%m-%d') AS day, used_micro, run_count FROM usage_days WHERE user_id = ? ORDER BY day", u.ID); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint([]any{"2026-03-07", 25_000, 1, "2026-03-08", 5_000, 1}); len(days) != 2 ||
		fmt.Sprint([]any{days[0].Day, days[0].Used, days[0].Runs, days[1].Day, days[1].Used, days[1].Runs}) != want {
		t.Fatalf("day ledger %+v; want %s", days, want)
	}
	for _, side := range []struct {
		st              *holds.Store
		day             string
		used, available int64
	}{{before, "2026-03-07", 25_000, 5_000}, {after, "2026-03-08", 5_000, 25_000}} {
		b, err := side.st.Balance(ctx, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		if b.Day.Format(time.DateOnly) != side.day || b.UsedTodayMicro != side.used || b.HeldMicro != 0 || b.AvailableMicro != side.available {
			t.Errorf("balance on %s: %+v; want used %d, nothing held, %d available", side.day, b, side.used, side.available)
		}
	}
}

// TestDayIsUTCWhateverTheDSNSays: an operator's DSN may carry a session time zone and a
// driver location of its own (time_zone='-05:00', loc=Asia/Tokyo); Open overrides both, so
// that NOW(6), DATE(NOW(6)) and the times the driver reads and writes are UTC. Here the
// database stands at 02:00 UTC on 8 March, still 7 March at -05:00 and already 11:00 in
// Tokyo: a charge lands on the UTC day, and the times read back are the instants written.
func TestDayIsUTCWhateverTheDSNSays(t *testing.T) {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'-05:00'"
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatalf("load Asia/Tokyo (time/tzdata is embedded): %v", err)
	}
	cfg.Loc = tokyo
	at := time.Date(2026, 3, 8, 2, 0, 0, 0, time.UTC)
	db := openAt(t, cfg.FormatDSN(), at)
	var tz string
	if err := db.Get(&tz, "SELECT @@session.time_zone"); err != nil || tz != "+00:00" {
		t.Errorf("session time zone %q, %v: want +00:00", tz, err)
	}
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := st.CreateUser(ctx, "tz-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(ctx, holds.AdmitRequest{RunID: "r_tz", UserID: u.ID, State: holds.StateRunning, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Settle(ctx, holds.Settlement{RunID: "r_tz", CostMicro: 7_000, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Run(ctx, u.ID, "r_tz")
	if err != nil {
		t.Fatal(err)
	}
	if !r.CreatedAt.Equal(at) || !r.SettledAt.Time.Equal(at) || !r.ExpiresAt.Equal(at.Add(time.Minute)) || !r.ReadAt.Equal(at) {
		t.Errorf("run times created %v settled %v expires %v read %v; want %v, and expiry a minute later",
			r.CreatedAt, r.SettledAt.Time, r.ExpiresAt, r.ReadAt, at)
	}
	var day string
	if err := db.GetContext(ctx, &day, "SELECT DATE_FORMAT(day, '%Y-%m-%d') FROM usage_days WHERE user_id = ?", u.ID); err != nil || day != "2026-03-08" {
		t.Errorf("ledger day %q, %v: want the UTC day 2026-03-08", day, err)
	}
	b, err := st.Balance(ctx, u.ID)
	if err != nil || b.Day.Format(time.DateOnly) != "2026-03-08" || b.UsedTodayMicro != 7_000 {
		t.Errorf("balance %+v, %v: want 7000 used on 2026-03-08", b, err)
	}
}
