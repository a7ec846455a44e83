package testenv

import (
	"context"
	"testing"
)

// CheckLedger asserts the invariant every money test ends with: for each user and UTC day,
// the day ledger equals the sum of charged_micro of the holds settled that day, its run_count
// equals the number of those holds that charged anything, and each charge's allowance and
// prepaid parts add up to it.
func CheckLedger(t testing.TB, db interface {
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
}) {
	t.Helper()
	ctx := context.Background()
	type row struct {
		UserID  uint64 `db:"user_id"`
		Day     string `db:"day"`
		Ledger  int64  `db:"ledger"`
		Charged int64  `db:"charged"`
		Runs    int64  `db:"runs"`
		Counted int64  `db:"counted"`
	}
	var rows []row
	err := db.SelectContext(ctx, &rows, `
		SELECT k.user_id, DATE_FORMAT(k.day, '%Y-%m-%d') AS day,
		       COALESCE(d.used_micro, 0) AS ledger, COALESCE(h.charged, 0) AS charged,
		       COALESCE(d.run_count, 0) AS runs, COALESCE(h.counted, 0) AS counted
		FROM (SELECT user_id, day FROM usage_days
		      UNION SELECT user_id, DATE(settled_at) FROM run_holds WHERE state = 'settled') k
		LEFT JOIN usage_days d ON d.user_id = k.user_id AND d.day = k.day
		LEFT JOIN (SELECT user_id, DATE(settled_at) AS day, SUM(charged_micro) AS charged,
		                  SUM(charged_micro > 0) AS counted
		           FROM run_holds WHERE state = 'settled' GROUP BY user_id, DATE(settled_at)) h
		       ON h.user_id = k.user_id AND h.day = k.day`)
	if err != nil {
		t.Fatalf("ledger check query: %v", err)
	}
	for _, r := range rows {
		if r.Ledger != r.Charged || r.Runs != r.Counted {
			t.Errorf("day ledger of user %d on %s: used_micro %d run_count %d, settled holds charged %d in %d runs",
				r.UserID, r.Day, r.Ledger, r.Runs, r.Charged, r.Counted)
		}
	}
	var bad []struct {
		RunID string `db:"run_id"`
	}
	if err := db.SelectContext(ctx, &bad, `SELECT run_id FROM run_holds
		WHERE allowance_part_micro + prepaid_part_micro <> charged_micro OR charged_micro < 0 OR
		      (state <> 'settled' AND charged_micro <> 0)`); err != nil {
		t.Fatalf("ledger check query: %v", err)
	}
	for _, b := range bad {
		t.Errorf("run %s: charge parts do not add up", b.RunID)
	}
}
