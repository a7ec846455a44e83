package holds

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"
)

// The usage report: charges by user, UTC day of settlement and model, with the day ledger
// beside them to check against.

// UsageRow is one line of the usage report: one user, one UTC day of settlement, one model.
type UsageRow struct {
	UserID      uint64 `db:"user_id"`
	UserName    string `db:"user_name"`
	Day         string `db:"day"` // YYYY-MM-DD, the UTC day the runs settled (the day ledger's day)
	Model       string `db:"model"`
	Runs        int64  `db:"runs"`         // settled runs, releases at 0 included
	ChargedRuns int64  `db:"charged_runs"` // of those, runs that charged anything (the ledger's run_count)
	// EstimatedRuns: of Runs, those charged an estimate for at least one call (no usage report
	// from the provider): their tokens are the gateway's count, not what the provider invoices.
	EstimatedRuns int64 `db:"estimated_runs"`
	Calls         int64 `db:"calls"`
	InTok         int64 `db:"in_tok"`
	CacheReadTok  int64 `db:"cache_read_tok"`
	CacheWriteTok int64 `db:"cache_write_tok"`
	OutTok        int64 `db:"out_tok"`
	// CacheWrite1hTok, AudioInTok and AudioOutTok are the parts of CacheWriteTok, InTok and
	// OutTok that were one-hour cache writes, audio input and audio output, which a provider's
	// invoice lists apart. Runs settled before migration 014 count 0 in them.
	CacheWrite1hTok    int64 `db:"cache_write_1h_tok"`
	AudioInTok         int64 `db:"audio_in_tok"`
	AudioOutTok        int64 `db:"audio_out_tok"`
	CostMicro          int64 `db:"cost_micro"`
	ChargedMicro       int64 `db:"charged_micro"`
	AllowancePartMicro int64 `db:"allowance_part_micro"`
	PrepaidPartMicro   int64 `db:"prepaid_part_micro"`
}

// add adds r's counts and amounts to u's.
func (u *UsageRow) add(r UsageRow) {
	u.Runs += r.Runs
	u.ChargedRuns += r.ChargedRuns
	u.EstimatedRuns += r.EstimatedRuns
	u.Calls += r.Calls
	u.InTok += r.InTok
	u.CacheReadTok += r.CacheReadTok
	u.CacheWriteTok += r.CacheWriteTok
	u.OutTok += r.OutTok
	u.CacheWrite1hTok += r.CacheWrite1hTok
	u.AudioInTok += r.AudioInTok
	u.AudioOutTok += r.AudioOutTok
	u.CostMicro += r.CostMicro
	u.ChargedMicro += r.ChargedMicro
	u.AllowancePartMicro += r.AllowancePartMicro
	u.PrepaidPartMicro += r.PrepaidPartMicro
}

// UsageReport is settled usage over a range of UTC days, by user, day and model.
type UsageReport struct {
	From, To string // inclusive, YYYY-MM-DD
	Rows     []UsageRow
	Totals   UsageRow // sums over Rows; user, day and model empty
	// LedgerMicro and LedgerRuns are the day ledger (usage_days) over the same users and days.
	// They equal Totals.ChargedMicro and Totals.ChargedRuns; a report that shows otherwise
	// has found a bug, which is why it carries both.
	LedgerMicro int64
	LedgerRuns  int64
}

// maxReportDays bounds a report's range, so one request cannot scan the table's whole life.
const maxReportDays = 366

// maxReportRows bounds the rows (user × day × model) one report holds in memory, about 30 MB:
// a busy range is asked for user by user, or in shorter ranges. A variable for tests.
var maxReportRows = 100_000

// Today is the database's UTC day: the day a charge settled now lands on in the ledger, which
// a usage report asked without dates covers. The gateway's clock may be on the other side of
// midnight from it.
func (s *Store) Today(ctx context.Context) (time.Time, error) {
	var today time.Time
	if err := s.db.GetContext(ctx, &today, "SELECT TIMESTAMP(UTC_DATE())"); err != nil {
		return time.Time{}, fmt.Errorf("today: %w", err)
	}
	return today.UTC(), nil
}

// Usage reports settled runs between the UTC days from and to, inclusive, for one user
// (userID != 0) or all. Runs are attributed to the day they settled, as the day ledger is.
func (s *Store) Usage(ctx context.Context, from, to time.Time, userID uint64) (UsageReport, error) {
	from, end, err := reportRange(from, to)
	if err != nil {
		return UsageReport{}, err
	}
	rep := UsageReport{From: from.Format(time.DateOnly), To: end.AddDate(0, 0, -1).Format(time.DateOnly), Rows: []UsageRow{}}
	userCond, args := "", []any{from, end}
	if userID != 0 {
		userCond, args = " AND h.user_id = ?", append(args, userID)
	}
	rowArgs := append(append([]any{}, args...), args...) // the query reads runs kept and runs pruned
	var ledger struct {
		Used int64 `db:"used"`
		Runs int64 `db:"runs"`
	}
	// One read-only REPEATABLE READ transaction, so the rows and the ledger are the same
	// snapshot (the sessions' READ COMMITTED would give each statement its own).
	err = s.withRetry(ctx, "usage report", func() error {
		tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		rep.Rows = rep.Rows[:0]
		if err := tx.SelectContext(ctx, &rep.Rows, usageRowsQuery(userCond), rowArgs...); err != nil {
			return err
		}
		return tx.GetContext(ctx, &ledger, usageLedgerQuery(userCond), args...)
	})
	if err != nil {
		return UsageReport{}, fmt.Errorf("usage report %s..%s: %w", rep.From, rep.To, err)
	}
	if len(rep.Rows) > maxReportRows {
		return UsageReport{}, fmt.Errorf("usage report %s..%s: %w: more than %d rows; name a user or shorten the range",
			rep.From, rep.To, ErrBadFilter, maxReportRows)
	}
	for _, r := range rep.Rows {
		rep.Totals.add(r)
	}
	rep.LedgerMicro, rep.LedgerRuns = ledger.Used, ledger.Runs
	if rep.LedgerMicro != rep.Totals.ChargedMicro || rep.LedgerRuns != rep.Totals.ChargedRuns {
		s.log.Error("usage report disagrees with the day ledger", zap.String("from", rep.From), zap.String("to", rep.To),
			zap.Uint64("user_id", userID), zap.Int64("ledger_micro", rep.LedgerMicro), zap.Int64("charged_micro", rep.Totals.ChargedMicro),
			zap.Int64("ledger_runs", rep.LedgerRuns), zap.Int64("charged_runs", rep.Totals.ChargedRuns))
	}
	return rep, nil
}

// reportRange is the report's days as the half-open range [from, end) of UTC midnights,
// refused when reversed, longer than maxReportDays or outside what a DATETIME holds.
func reportRange(from, to time.Time) (time.Time, time.Time, error) {
	from, to = day(from), day(to)
	if to.Before(from) {
		return time.Time{}, time.Time{}, fmt.Errorf("usage report: %w: to %s before from %s", ErrBadFilter, to.Format(time.DateOnly), from.Format(time.DateOnly))
	}
	if days := int(to.Sub(from)/(24*time.Hour)) + 1; days > maxReportDays {
		return time.Time{}, time.Time{}, fmt.Errorf("usage report: %w: %d days, at most %d", ErrBadFilter, days, maxReportDays)
	}
	end := to.AddDate(0, 0, 1)
	if !storableTime(from) || !storableTime(end) {
		return time.Time{}, time.Time{}, fmt.Errorf("usage report: %w: days must lie between 0001-01-01 and 9999-12-30", ErrBadFilter)
	}
	return from, end, nil
}

// usageRowsQuery sums settled runs still kept per user, day and model, and adds the sums of
// those pruned (PruneSettled), which are kept on the same grouping: a day reads the same
// either way. Models are told apart byte for byte, as the gateway prices and forwards them:
// run_holds.model's collation folds case and ignores trailing spaces, and grouped by it the
// runs of "gpt-4o-X" and "gpt-4o-x" were one row (pruned_runs.model is VARBINARY, migration
// 016). A user's day shows at most MaxPrunedModels models by name, those it was charged most for
// (then cost, tokens, name), and sums the rest into its FoldedModel row, as a pruned day keeps
// them: prices match by prefix, so one caller's distinct names ("gpt-4o-<random>", each
// refused by the provider at 0) made a row each, and past maxReportRows refused every report
// of their day, their user's own included, until a prune. A user's report is so at most
// maxReportDays × (MaxPrunedModels + 1) rows, below maxReportRows. Its arguments are the
// range's two ends (and the user, when userCond names one) twice: once for each table. It
// reads one row past maxReportRows, to tell a report cut short.
func usageRowsQuery(userCond string) string {
	return `SELECT m.user_id, m.user_name, m.day,
		       IF(m.model <> '' AND m.place > ` + strconv.Itoa(MaxPrunedModels) + `, CAST('' AS BINARY), m.model) AS model,
		       SUM(m.runs) AS runs, SUM(m.charged_runs) AS charged_runs, SUM(m.estimated_runs) AS estimated_runs, SUM(m.calls) AS calls,
		       SUM(m.in_tok) AS in_tok, SUM(m.cache_read_tok) AS cache_read_tok,
		       SUM(m.cache_write_tok) AS cache_write_tok, SUM(m.out_tok) AS out_tok,
		       SUM(m.cache_write_1h_tok) AS cache_write_1h_tok, SUM(m.audio_in_tok) AS audio_in_tok,
		       SUM(m.audio_out_tok) AS audio_out_tok,
		       SUM(m.cost_micro) AS cost_micro, SUM(m.charged_micro) AS charged_micro,
		       SUM(m.allowance_part_micro) AS allowance_part_micro, SUM(m.prepaid_part_micro) AS prepaid_part_micro
		FROM (SELECT g.*, ROW_NUMBER() OVER (PARTITION BY g.user_id, g.day, g.model = ''
		             ORDER BY g.charged_micro DESC, g.cost_micro DESC,
		                      g.in_tok + g.cache_read_tok + g.cache_write_tok + g.out_tok DESC, g.model) AS place
		      FROM (SELECT h.user_id, u.name AS user_name, h.day, h.model,
		       SUM(h.runs) AS runs, SUM(h.charged_runs) AS charged_runs, SUM(h.estimated_runs) AS estimated_runs, SUM(h.calls) AS calls,
		       SUM(h.in_tok) AS in_tok, SUM(h.cache_read_tok) AS cache_read_tok,
		       SUM(h.cache_write_tok) AS cache_write_tok, SUM(h.out_tok) AS out_tok,
		       SUM(h.cache_write_1h_tok) AS cache_write_1h_tok, SUM(h.audio_in_tok) AS audio_in_tok,
		       SUM(h.audio_out_tok) AS audio_out_tok,
		       SUM(h.cost_micro) AS cost_micro, SUM(h.charged_micro) AS charged_micro,
		       SUM(h.allowance_part_micro) AS allowance_part_micro, SUM(h.prepaid_part_micro) AS prepaid_part_micro
		FROM (SELECT h.user_id, DATE_FORMAT(h.settled_at, '%Y-%m-%d') AS day, CAST(h.model AS BINARY) AS model,
		             COUNT(*) AS runs, SUM(h.charged_micro > 0) AS charged_runs, SUM(h.estimated) AS estimated_runs, SUM(h.calls) AS calls,
		             SUM(h.in_tok) AS in_tok, SUM(h.cache_read_tok) AS cache_read_tok,
		             SUM(h.cache_write_tok) AS cache_write_tok, SUM(h.out_tok) AS out_tok,
		             SUM(h.cache_write_1h_tok) AS cache_write_1h_tok, SUM(h.audio_in_tok) AS audio_in_tok,
		             SUM(h.audio_out_tok) AS audio_out_tok,
		             SUM(h.cost_micro) AS cost_micro, SUM(h.charged_micro) AS charged_micro,
		             SUM(h.allowance_part_micro) AS allowance_part_micro, SUM(h.prepaid_part_micro) AS prepaid_part_micro
		      FROM run_holds h
		      WHERE h.state = 'settled' AND h.settled_at >= ? AND h.settled_at < ?` + userCond + `
		      GROUP BY h.user_id, DATE_FORMAT(h.settled_at, '%Y-%m-%d'), CAST(h.model AS BINARY)
		      UNION ALL
		      SELECT h.user_id, DATE_FORMAT(h.day, '%Y-%m-%d'), h.model, h.runs, h.charged_runs, h.estimated_runs, h.calls, h.in_tok,
		             h.cache_read_tok, h.cache_write_tok, h.out_tok, h.cache_write_1h_tok, h.audio_in_tok, h.audio_out_tok,
		             h.cost_micro, h.charged_micro,
		             h.allowance_part_micro, h.prepaid_part_micro
		      FROM pruned_runs h WHERE h.day >= ? AND h.day < ?` + userCond + `) h
		JOIN users u ON u.id = h.user_id
		GROUP BY h.user_id, u.name, h.day, h.model) g) m
		GROUP BY m.user_id, m.user_name, m.day, 4
		ORDER BY m.user_name, m.day, 4
		LIMIT ` + strconv.Itoa(maxReportRows+1)
}

// usageLedgerQuery reads the day ledger over the same users and days, to check the rows by.
func usageLedgerQuery(userCond string) string {
	return `SELECT COALESCE(SUM(used_micro), 0) AS used, COALESCE(SUM(run_count), 0) AS runs
		FROM usage_days h WHERE h.day >= ? AND h.day < ?` + userCond
}

// day truncates t to its UTC day.
func day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// storableTime reports whether t, in UTC, is a DATETIME the database and its driver take
// (years 1-9999): an operator's typo in a filter is a 400, not a failed query.
func storableTime(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}
