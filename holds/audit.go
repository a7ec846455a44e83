package holds

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// Mismatch is a place where the books disagree with themselves.
type Mismatch struct {
	UserID uint64
	Day    string // UTC day; empty for a run whose charge parts do not add up
	RunID  string
	Detail string
}

// Audit checks the invariant every settlement preserves: for each user and UTC day, the day
// ledger equals the sum of charged_micro of the holds settled that day, and its run_count the
// number of those that charged anything; each charge's allowance and prepaid parts add up to
// it; no live hold carries a charge; and each user's prepaid credits are what their grants
// gave less the prepaid parts of their charges (grants and settlements are its only writers).
// Runs pruned (PruneSettled) count by their sums in pruned_runs. The tests end with it, the benchmark runs it after every
// scenario, and an operator can run it (`gateway audit`). It reads, never writes.
func Audit(ctx context.Context, db *sqlx.DB) ([]Mismatch, error) {
	var days []struct {
		UserID  uint64 `db:"user_id"`
		Day     string `db:"day"`
		Ledger  int64  `db:"ledger"`
		Charged int64  `db:"charged"`
		Runs    int64  `db:"runs"`
		Counted int64  `db:"counted"`
	}
	err := db.SelectContext(ctx, &days, `
		SELECT k.user_id, DATE_FORMAT(k.day, '%Y-%m-%d') AS day,
		       COALESCE(d.used_micro, 0) AS ledger, COALESCE(h.charged, 0) AS charged,
		       COALESCE(d.run_count, 0) AS runs, COALESCE(h.counted, 0) AS counted
		FROM (SELECT user_id, day FROM usage_days
		      UNION SELECT user_id, DATE(settled_at) FROM run_holds WHERE state = 'settled'
		      UNION SELECT user_id, day FROM pruned_runs) k
		LEFT JOIN usage_days d ON d.user_id = k.user_id AND d.day = k.day
		LEFT JOIN (SELECT user_id, day, SUM(charged) AS charged, SUM(counted) AS counted
		           FROM (SELECT user_id, DATE(settled_at) AS day, SUM(charged_micro) AS charged,
		                        SUM(charged_micro > 0) AS counted
		                 FROM run_holds WHERE state = 'settled' GROUP BY user_id, DATE(settled_at)
		                 UNION ALL
		                 SELECT user_id, day, SUM(charged_micro), SUM(charged_runs)
		                 FROM pruned_runs GROUP BY user_id, day) both_parts
		           GROUP BY user_id, day) h
		       ON h.user_id = k.user_id AND h.day = k.day`)
	if err != nil {
		return nil, fmt.Errorf("audit day ledger: %w", err)
	}
	var out []Mismatch
	for _, d := range days {
		if d.Ledger != d.Charged || d.Runs != d.Counted {
			out = append(out, Mismatch{UserID: d.UserID, Day: d.Day, Detail: fmt.Sprintf(
				"ledger %d µUSD in %d runs, settled holds charged %d µUSD in %d runs", d.Ledger, d.Runs, d.Charged, d.Counted)})
		}
	}
	var runs []struct {
		RunID  string `db:"run_id"`
		UserID uint64 `db:"user_id"`
	}
	err = db.SelectContext(ctx, &runs, `SELECT run_id, user_id FROM run_holds
		WHERE allowance_part_micro + prepaid_part_micro <> charged_micro OR charged_micro < 0 OR
		      (state <> 'settled' AND charged_micro <> 0)`)
	if err != nil {
		return nil, fmt.Errorf("audit charge parts: %w", err)
	}
	for _, r := range runs {
		out = append(out, Mismatch{UserID: r.UserID, RunID: r.RunID, Detail: "charge parts do not add up, or a live hold carries a charge"})
	}
	var users []struct {
		UserID  uint64 `db:"id"`
		Prepaid int64  `db:"prepaid"`
		Granted int64  `db:"granted"`
		Spent   int64  `db:"spent"`
		Differs bool   `db:"differs"`
	}
	// One statement: one snapshot, so a settlement committing meanwhile is seen whole or not at all.
	// The comparison is the database's, in exact DECIMAL: granted - spent in int64 wraps just as
	// a wrapped balance did, and the two agreed on a refund that had overflowed into a credit.
	err = db.SelectContext(ctx, &users, `
		SELECT a.id, a.prepaid, CAST(a.granted AS SIGNED) AS granted, CAST(a.spent AS SIGNED) AS spent,
		       a.prepaid <> a.granted - a.spent AS differs
		FROM (SELECT u.id, u.prepaid_micro AS prepaid,
		             COALESCE((SELECT SUM(amount_micro) FROM grants g WHERE g.user_id = u.id), 0) AS granted,
		             COALESCE((SELECT SUM(prepaid_part_micro) FROM run_holds h WHERE h.user_id = u.id), 0) +
		             COALESCE((SELECT SUM(prepaid_part_micro) FROM pruned_runs p WHERE p.user_id = u.id), 0) AS spent
		      FROM users u) a`)
	if err != nil {
		return nil, fmt.Errorf("audit prepaid credits: %w", err)
	}
	for _, u := range users {
		if u.Differs {
			out = append(out, Mismatch{UserID: u.UserID, Detail: fmt.Sprintf(
				"prepaid %d µUSD, but grants gave %d and charges took %d", u.Prepaid, u.Granted, u.Spent)})
		}
	}
	return out, nil
}
