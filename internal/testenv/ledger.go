package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// CheckLedger asserts the invariant every money test ends with (holds.Audit): the day
// ledger equals the sum of charged_micro of the holds settled each day, run counts agree, and
// every charge's allowance and prepaid parts add up to it.
func CheckLedger(t testing.TB, db *sqlx.DB) {
	t.Helper()
	bad, err := holds.Audit(context.Background(), db)
	if err != nil {
		t.Fatalf("ledger audit: %v", err)
	}
	for _, m := range bad {
		t.Errorf("ledger audit: user %d day %q run %q: %s", m.UserID, m.Day, m.RunID, m.Detail)
	}
}

// LedgerUsed is what the day ledger holds for the user over all its days: what its
// settlements charged it. A test's user is its own, charged only while the test runs, so this
// is its ledger whether or not the test straddles midnight UTC: a settlement at 23:59:59.9
// lands on the old day's row, and a read of UTC_DATE()'s row alone at 00:00:00.1 missed it.
func LedgerUsed(ctx context.Context, db sqlx.QueryerContext, userID uint64) (int64, error) {
	return ledgerUsedBut(ctx, db, userID, time.Time{})
}

// ledgerUsedBut is LedgerUsed less the row of day (none for the zero time).
func ledgerUsedBut(ctx context.Context, db sqlx.QueryerContext, userID uint64, day time.Time) (int64, error) {
	var used int64
	if err := sqlx.GetContext(ctx, db, &used, "SELECT CAST(COALESCE(SUM(used_micro), 0) AS SIGNED) FROM usage_days WHERE user_id = ? AND day <> ?",
		userID, day.Format(time.DateOnly)); err != nil {
		return 0, fmt.Errorf("day ledger of user %d: %w", userID, err)
	}
	return used, nil
}

// BalanceAllDays is st.Balance with every day of the user's ledger counted as today's
// (UsedTodayMicro, and AvailableMicro from it). Balance counts today's row alone: a test that
// settled a call and read the balance after, across midnight UTC, found the call's charge,
// landed on the old day, missing (and a fresh day's allowance). With no midnight in between
// the two agree to the micro-USD. Read it while none of the user's settlements is under way:
// the balance and the other days' rows are two statements.
func BalanceAllDays(ctx context.Context, st *holds.Store, userID uint64) (holds.Balance, error) {
	b, err := st.Balance(ctx, userID)
	if err != nil {
		return b, err
	}
	other, err := ledgerUsedBut(ctx, st.DB(), userID, b.Day)
	if err != nil {
		return holds.Balance{}, err
	}
	b.UsedTodayMicro += other
	b.AvailableMicro = holds.Available(b.AllowanceMicro, b.UsedTodayMicro, b.PrepaidMicro, b.HeldMicro)
	return b, nil
}

// SettledDay is the UTC day the user's latest settlement landed on in the ledger (its
// settled_at's day, as holds.Audit pairs them). A test that settles calls and then reports
// "today" means this day: UTC_DATE() read after a midnight that fell between the two is the
// next one, whose report is empty.
func SettledDay(ctx context.Context, db sqlx.QueryerContext, userID uint64) (time.Time, error) {
	var day *time.Time
	if err := sqlx.GetContext(ctx, db, &day, "SELECT TIMESTAMP(DATE(MAX(settled_at))) FROM run_holds WHERE user_id = ? AND state = 'settled'", userID); err != nil {
		return time.Time{}, fmt.Errorf("settled day of user %d: %w", userID, err)
	}
	if day == nil {
		return time.Time{}, fmt.Errorf("settled day of user %d: it has no settled run", userID)
	}
	return day.UTC(), nil
}
