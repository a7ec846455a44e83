package holds

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// MinPruneAge is the youngest a settled run may be to be pruned. Until then something may
// still name it: an Idempotency-Key's replay (replay_ttl, a day by default) reads the run its
// attempt settled, a session's row points at its last run, and an operator looks a recent
// run up. PruneSettled refuses less; the command also refuses less than replay_ttl.
const MinPruneAge = 7 * 24 * time.Hour

// MaxPruneBatch bounds one prune transaction: the run rows it locks and deletes, and its
// statements' size. Settled rows are locked by nobody else but a late duplicate settlement,
// which waits for the batch, so a batch is short rather than small.
const MaxPruneBatch = 10_000

// MaxPrunedModels bounds the pruned_runs rows of one user and UTC day: the models kept by
// name. Prices match by prefix, so a caller can send endless distinct names ("gpt-4o-<random>")
// that are admitted, refused by the provider and settled at 0; a row per name would keep the
// table growing with what a hostile or buggy caller sent, however often it is pruned. Past
// the bound a day's runs are added into its row under FoldedModel (a model that used something
// first taking the place of one that used nothing): every total stays exact, only the split by
// model of those runs is lost. A hundred is far more models than a user
// calls in a day in earnest.
const MaxPrunedModels = 100

// FoldedModel is the model name of a pruned day's row that sums the runs of the models past
// MaxPrunedModels. No call can be admitted under it (a request must name a model), so it is
// never a model's own row; runs recorded without a model, which the gateway does not admit,
// land in it too.
const FoldedModel = ""

// PruneResult is what PruneSettled did.
type PruneResult struct {
	Runs    int64 // settled runs deleted
	Batches int   // transactions committed
}

// PruneSettled deletes the settled runs that settled more than olderThan ago (by the
// database clock), batch at a time, oldest first, until none is left. A run_holds row is
// kept per call, for good, unless this runs: each batch first adds its rows into
// pruned_runs (per user, UTC day and model, at most MaxPrunedModels models a day and the rest
// under FoldedModel) in the same transaction as the delete, so the
// usage report, the day ledger's audit and the prepaid audit read the same totals after as
// before. A batch is one transaction: a crash or a lost COMMIT reply leaves every row of it
// either moved or in place, and a rerun goes on from there. Live runs are never touched, nor are
// runs given a pause refund, whose grant's key names their id for good (pruneBatch).
//
// A run pruned is forgotten: GET /v1/runs/{id} answers 404, and a caller's X-Run-Id of it,
// sent again, opens a new run (charged for its own calls) instead of 409 run_settled.
func (s *Store) PruneSettled(ctx context.Context, olderThan time.Duration, batch int) (PruneResult, error) {
	var res PruneResult
	if olderThan < MinPruneAge {
		return res, fmt.Errorf("prune: %w: older than %v, at least %v", ErrBadFilter, olderThan, MinPruneAge)
	}
	if batch < 1 || batch > MaxPruneBatch {
		return res, fmt.Errorf("prune: %w: batch of %d, 1 to %d", ErrBadFilter, batch, MaxPruneBatch)
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("prune after %d runs: %w", res.Runs, err)
		}
		var (
			n, unanswered, unansweredBatches int
			tried                            []string // the runs the last attempt deleted; if its commit failed, gone means committed
		)
		// A batch refused for want of room (1114, 1021) is tried again until ctx ends, as a
		// refusal read_only is (withRoomRetry): its statements add to pruned_runs (a new row
		// per user, day and model) and write undo for the delete, either of which may need the
		// disk to grow, and the refusal rolled the batch's transaction back whole, nothing of it
		// committed (so it is not counted as unanswered below). Given up at once, the command
		// failed for a disk an operator frees in a minute.
		err := s.withRoomRetry(ctx, "prune", nil, func() error {
			return s.tryTx(ctx, func(tx *sqlx.Tx) error {
				// An attempt tried again after its COMMIT went out unanswered may have committed:
				// its runs are then gone, and this attempt prunes the next ones. Counted here, or
				// the command printed fewer runs (and batches) than it pruned. An attempt that had not
				// committed (its connection dropped before the COMMIT ran) released its rows, and a
				// prune running beside this one may have taken them: both count them then, at most a
				// batch per lost reply, in the printed count only (pruned_runs sums each run once).
				if len(tried) > 0 {
					left, err := countRuns(ctx, tx, tried)
					if err != nil {
						return err
					}
					// Added up: an attempt after this one may lose its reply too, and its retry
					// counts only its own runs.
					if gone := len(tried) - left; gone > 0 {
						unanswered += gone
						unansweredBatches++
					}
					tried = nil
				}
				var err error
				n, tried, err = pruneBatch(ctx, tx, olderThan, batch)
				return err
			})
		})
		res.Runs += int64(unanswered)
		res.Batches += unansweredBatches
		if err != nil {
			return res, fmt.Errorf("prune after %d runs: %w", res.Runs, err)
		}
		if n == 0 {
			return res, nil
		}
		res.Runs += int64(n)
		res.Batches++
		if n < batch {
			return res, nil
		}
	}
}

// countRuns counts which of runs are still in run_holds.
func countRuns(ctx context.Context, tx *sqlx.Tx, runs []string) (int, error) {
	q, args, err := sqlx.In("SELECT COUNT(*) FROM run_holds WHERE run_id IN (?)", runs)
	if err != nil {
		return 0, fmt.Errorf("count runs of an unanswered prune: %w", err)
	}
	var n int
	if err := tx.GetContext(ctx, &n, q, args...); err != nil {
		return 0, fmt.Errorf("count runs of an unanswered prune: %w", err)
	}
	return n, nil
}

// prunedRun is a settled run's row as PruneSettled reads it: what a pruned_runs row sums, a
// usage report's row of one run (UserName unused).
type prunedRun struct {
	RunID string `db:"run_id"`
	UsageRow
}

// pruneBatch moves up to batch of the oldest prunable runs into pruned_runs and deletes them.
// Their rows are locked as they are read, so the delete removes exactly what was summed. No
// user row is locked: a settled run's row is written by no settlement (a late duplicate one
// locks it, after its user's, and finds it settled), so this cannot join a cycle with the
// users -> run_holds -> usage_days order, and pruned_runs is written by prunes alone.
//
// A run given a pause refund (a grant keyed PauseRefundKey of its id, which is never deleted)
// is not prunable: its id would be free again while the grant's key still names it, and an
// Idempotency-Key sent again after its record expired opens its attempt 0 under that same id
// (the proxy's idempotentRunID). Charged its hold under a pause too, that run's refund found the
// old grant under its key — the reconciler's pass skipped it as refunded, the process's own of
// the same amount got the old grant back — and the user kept the charge for a call that used
// nothing. Kept, the id stays taken, and the retry moves on to its next attempt. Such runs are
// few (a process stopped past its hold, then resumed).
func pruneBatch(ctx context.Context, tx *sqlx.Tx, olderThan time.Duration, batch int) (int, []string, error) {
	var rows []prunedRun
	err := tx.SelectContext(ctx, &rows, `SELECT run_id, user_id, DATE_FORMAT(settled_at, '%Y-%m-%d') AS day, model,
		       1 AS runs, charged_micro > 0 AS charged_runs, estimated AS estimated_runs, calls, in_tok, cache_read_tok, cache_write_tok, out_tok,
		       cache_write_1h_tok, audio_in_tok, audio_out_tok, cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro
		FROM run_holds WHERE settled_at < NOW(6) - INTERVAL ? MICROSECOND AND state = 'settled'
		  AND (settle_source <> ? OR NOT EXISTS (SELECT 1 FROM grants g WHERE g.idempotency_key = CONCAT('pause-refund:', run_holds.run_id)))
		ORDER BY settled_at LIMIT ? FOR UPDATE`, olderThan.Microseconds(), SourceReconcileHold, batch)
	if err != nil {
		return 0, nil, fmt.Errorf("read runs to prune: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil, nil
	}
	sums, err := boundModels(ctx, tx, sumPruned(rows))
	if err != nil {
		return 0, nil, err
	}
	for from := 0; from < len(sums); from += prunedRowsPerInsert {
		if err := addPruned(ctx, tx, sums[from:min(from+prunedRowsPerInsert, len(sums))]); err != nil {
			return 0, nil, fmt.Errorf("add %d runs to pruned_runs: %w", len(rows), err)
		}
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.RunID
	}
	del, delArgs, err := sqlx.In("DELETE FROM run_holds WHERE state = 'settled' AND run_id IN (?)", ids)
	if err != nil {
		return 0, nil, fmt.Errorf("delete pruned runs: %w", err)
	}
	res, err := tx.ExecContext(ctx, del, delArgs...)
	if err != nil {
		return 0, nil, fmt.Errorf("delete %d pruned runs: %w", len(rows), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, nil, fmt.Errorf("delete pruned runs: rows deleted: %w", err)
	}
	if n != int64(len(rows)) {
		// The rows were locked when read: anything else is a broken assumption, and the sums
		// just written must not commit without their deletes.
		return 0, nil, fmt.Errorf("delete pruned runs: %d of %d deleted", n, len(rows))
	}
	// A settlement deletes its run's call keys; a gateway of before run_calls (a rolling
	// upgrade) left them, and an Idempotency-Key attempt's settlement leaves the one key its
	// row recorded when Redis refused to store its answer.
	del, delArgs, err = sqlx.In("DELETE FROM run_calls WHERE run_id IN (?)", ids)
	if err != nil {
		return 0, nil, fmt.Errorf("delete pruned runs' calls: %w", err)
	}
	if _, err := tx.ExecContext(ctx, del, delArgs...); err != nil {
		return 0, nil, fmt.Errorf("delete %d pruned runs' calls: %w", len(rows), err)
	}
	return len(rows), ids, nil
}

// sumPruned adds runs up per user, day and model, ordered by them: two prunes at once then
// upsert the pruned_runs rows they share in the same order, and cannot deadlock on them.
func sumPruned(rows []prunedRun) []UsageRow {
	type key struct {
		user       uint64
		day, model string
	}
	at := make(map[key]int, len(rows))
	var out []UsageRow
	for _, r := range rows {
		k := key{r.UserID, r.Day, r.Model}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, r.UsageRow)
			continue
		}
		out[i].add(r.UsageRow)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.Day, b.Day), cmp.Compare(a.Model, b.Model))
	})
	return out
}

// userDay is one user's UTC day, as pruned_runs keys it.
type userDay struct {
	user uint64
	day  string
}

// boundModels keeps sums (sorted by sumPruned) within MaxPrunedModels models per user and day:
// a model that has its row already is added to it, a new one gets a row while the day has
// fewer, the batch's dearest first, and the rest are added into the day's FoldedModel sum. On
// a full day, a new model that used something takes the place of a row of one that used
// nothing (refused names, which fill the places first when they are sent first), and that
// row is deleted and added into the FoldedModel sum instead: the models a provider's invoice
// lists keep their rows unless a day used more than MaxPrunedModels of them. It returns the
// sums to write, sorted as sumPruned's.
//
// The day's rows are read without a lock: no two prune batches are ever past their locking read
// of run_holds at once. Each reads the oldest prunable runs, so a second prune's read meets the
// first's oldest locked row (whatever plan it takes: an index walk from the oldest, or a scan
// that locks every old row it reads) and waits for its commit; two prunes cannot both count a
// day and open its last free places. Nothing else writes pruned_runs.
func boundModels(ctx context.Context, tx *sqlx.Tx, sums []UsageRow) ([]UsageRow, error) {
	var days []userDay
	for _, t := range sums {
		if d := (userDay{t.UserID, t.Day}); len(days) == 0 || days[len(days)-1] != d {
			days = append(days, d)
		}
	}
	var q strings.Builder
	q.WriteString("SELECT user_id, DATE_FORMAT(day, '%Y-%m-%d') AS day, COUNT(*) AS n FROM pruned_runs WHERE model <> ? AND (")
	args := make([]any, 0, 1+3*len(sums))
	args = append(args, FoldedModel)
	for i, d := range days {
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("(user_id = ? AND day = ?)")
		args = append(args, d.user, d.day)
	}
	q.WriteString(") GROUP BY user_id, day")
	var counts []struct {
		UserID uint64 `db:"user_id"`
		Day    string `db:"day"`
		N      int    `db:"n"`
	}
	if err := tx.SelectContext(ctx, &counts, q.String(), args...); err != nil {
		return nil, fmt.Errorf("count the pruned models of %d users' days: %w", len(days), err)
	}
	free := make(map[userDay]int, len(days))
	for _, d := range days {
		free[d] = MaxPrunedModels
	}
	for _, c := range counts {
		free[userDay{c.UserID, c.Day}] = MaxPrunedModels - c.N
	}
	// Which of the batch's models have their row, asked only of days that have rows: a day
	// pruned for the first time (most of them) has none.
	type dayModel struct {
		userDay
		model string
	}
	has := make(map[dayModel]bool)
	q.Reset()
	q.WriteString("SELECT user_id, DATE_FORMAT(day, '%Y-%m-%d') AS day, model FROM pruned_runs WHERE ")
	args = args[:0]
	for _, t := range sums {
		if t.Model == FoldedModel || free[userDay{t.UserID, t.Day}] == MaxPrunedModels {
			continue
		}
		if len(args) > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("(user_id = ? AND day = ? AND model = ?)")
		args = append(args, t.UserID, t.Day, t.Model)
	}
	if len(args) > 0 {
		var found []UsageRow
		if err := tx.SelectContext(ctx, &found, q.String(), args...); err != nil {
			return nil, fmt.Errorf("read the pruned models of %d users' days: %w", len(days), err)
		}
		for _, r := range found {
			has[dayModel{userDay{r.UserID, r.Day}, r.Model}] = true
		}
	}

	// New models, dearest first: of a batch's, a day past its bound keeps those it was charged most for.
	var fresh []int
	for i, t := range sums {
		if t.Model != FoldedModel && !has[dayModel{userDay{t.UserID, t.Day}, t.Model}] {
			fresh = append(fresh, i)
		}
	}
	slices.SortStableFunc(fresh, func(a, b int) int {
		x, y := sums[a], sums[b]
		return cmp.Or(cmp.Compare(y.ChargedMicro, x.ChargedMicro), cmp.Compare(y.CostMicro, x.CostMicro),
			cmp.Compare(y.InTok+y.CacheReadTok+y.CacheWriteTok+y.OutTok, x.InTok+x.CacheReadTok+x.CacheWriteTok+x.OutTok))
	})
	drop := make([]bool, len(sums))
	waiting := make(map[userDay][]int) // of a full day, its new models that used something, dearest first
	var full []userDay
	for _, i := range fresh {
		d := userDay{sums[i].UserID, sums[i].Day}
		if free[d] > 0 {
			free[d]--
			continue
		}
		drop[i] = true
		if !sums[i].usedNothing() {
			if len(waiting[d]) == 0 {
				full = append(full, d)
			}
			waiting[d] = append(waiting[d], i)
		}
	}
	// A full day's rows of models that used nothing give their places to these, and are folded.
	var evicted []UsageRow
	slices.SortFunc(full, func(a, b userDay) int { return cmp.Or(cmp.Compare(a.user, b.user), cmp.Compare(a.day, b.day)) })
	for _, d := range full {
		var batchModels []string
		for _, t := range sums {
			if t.UserID == d.user && t.Day == d.day && t.Model != FoldedModel {
				batchModels = append(batchModels, t.Model)
			}
		}
		rows, err := evictUnused(ctx, tx, d, len(waiting[d]), batchModels)
		if err != nil {
			return nil, err
		}
		for k := range rows {
			drop[waiting[d][k]] = false
		}
		evicted = append(evicted, rows...)
	}
	if !slices.Contains(drop, true) && len(evicted) == 0 {
		return sums, nil
	}
	folded := make(map[userDay]*UsageRow)
	fold := func(t UsageRow) {
		d := userDay{t.UserID, t.Day}
		if f, ok := folded[d]; ok {
			f.add(t)
			return
		}
		t.Model = FoldedModel
		folded[d] = &t
	}
	for _, t := range evicted {
		fold(t)
	}
	out := make([]UsageRow, 0, len(sums)+len(folded))
	for i, t := range sums {
		switch {
		case drop[i] || t.Model == FoldedModel:
			fold(t)
		default:
			out = append(out, t)
		}
	}
	for _, f := range folded {
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.Day, b.Day), cmp.Compare(a.Model, b.Model))
	})
	return out, nil
}

// prunedRowsPerInsert bounds the pruned_runs rows one INSERT adds: a batch of MaxPruneBatch
// runs of as many users' days and models sums to as many rows, 18 values each, and the server
// takes at most 65 535 placeholders in a statement. One INSERT for them all (180 000) worked
// only while the driver wrote the values into the text itself, which it does not for a
// statement past the DSN's maxAllowedPacket: that one went to the server prepared, and was
// refused (1390) at every run of the prune. A thousand rows is 18 000 placeholders, and under
// 400 KB written out with model names of the longest (MaxModelLen), within a 1 MB packet.
const prunedRowsPerInsert = 1000

// addPruned adds sums into their pruned_runs rows, each a user's day and model: new rows, or
// added into the row a prune before wrote.
func addPruned(ctx context.Context, tx *sqlx.Tx, sums []UsageRow) error {
	var q strings.Builder
	q.WriteString(`INSERT INTO pruned_runs (user_id, day, model, runs, charged_runs, estimated_runs, calls, in_tok, cache_read_tok,
		cache_write_tok, out_tok, cache_write_1h_tok, audio_in_tok, audio_out_tok, cost_micro, charged_micro,
		allowance_part_micro, prepaid_part_micro) VALUES `)
	args := make([]any, 0, 18*len(sums))
	for i, t := range sums {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
		args = append(args, t.UserID, t.Day, t.Model, t.Runs, t.ChargedRuns, t.EstimatedRuns, t.Calls, t.InTok, t.CacheReadTok,
			t.CacheWriteTok, t.OutTok, t.CacheWrite1hTok, t.AudioInTok, t.AudioOutTok, t.CostMicro, t.ChargedMicro,
			t.AllowancePartMicro, t.PrepaidPartMicro)
	}
	q.WriteString(` ON DUPLICATE KEY UPDATE runs = runs + VALUES(runs), charged_runs = charged_runs + VALUES(charged_runs),
		estimated_runs = estimated_runs + VALUES(estimated_runs),
		calls = calls + VALUES(calls), in_tok = in_tok + VALUES(in_tok), cache_read_tok = cache_read_tok + VALUES(cache_read_tok),
		cache_write_tok = cache_write_tok + VALUES(cache_write_tok), out_tok = out_tok + VALUES(out_tok),
		cache_write_1h_tok = cache_write_1h_tok + VALUES(cache_write_1h_tok),
		audio_in_tok = audio_in_tok + VALUES(audio_in_tok), audio_out_tok = audio_out_tok + VALUES(audio_out_tok),
		cost_micro = cost_micro + VALUES(cost_micro), charged_micro = charged_micro + VALUES(charged_micro),
		allowance_part_micro = allowance_part_micro + VALUES(allowance_part_micro),
		prepaid_part_micro = prepaid_part_micro + VALUES(prepaid_part_micro)`)
	_, err := tx.ExecContext(ctx, q.String(), args...)
	return err
}

// usedNothing reports whether runs cost and were charged nothing and counted no token: calls
// the provider refused, which its invoice does not list.
func (u UsageRow) usedNothing() bool {
	return u.CostMicro == 0 && u.ChargedMicro == 0 && u.InTok == 0 && u.CacheReadTok == 0 && u.CacheWriteTok == 0 && u.OutTok == 0
}

// evictUnused deletes up to n of the day's pruned_runs rows of models that used nothing, none of
// them among the batch's models (whose sums are about to be added to their rows), and returns
// them, to be added into the day's FoldedModel row in the same transaction.
func evictUnused(ctx context.Context, tx *sqlx.Tx, d userDay, n int, batchModels []string) ([]UsageRow, error) {
	q, args, err := sqlx.In(`SELECT user_id, DATE_FORMAT(day, '%Y-%m-%d') AS day, model, runs, charged_runs, estimated_runs, calls,
		       in_tok, cache_read_tok, cache_write_tok, out_tok, cache_write_1h_tok, audio_in_tok, audio_out_tok,
		       cost_micro, charged_micro, allowance_part_micro, prepaid_part_micro
		FROM pruned_runs WHERE user_id = ? AND day = ? AND model <> ? AND model NOT IN (?)
		  AND cost_micro = 0 AND charged_micro = 0 AND in_tok = 0 AND cache_read_tok = 0 AND cache_write_tok = 0 AND out_tok = 0
		ORDER BY model LIMIT ?`, d.user, d.day, FoldedModel, batchModels, n)
	if err != nil {
		return nil, fmt.Errorf("find pruned models that used nothing: %w", err)
	}
	var rows []UsageRow
	if err := tx.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("find pruned models of user %d on %s that used nothing: %w", d.user, d.day, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	models := make([]string, len(rows))
	for i, r := range rows {
		models[i] = r.Model
	}
	q, args, err = sqlx.In("DELETE FROM pruned_runs WHERE user_id = ? AND day = ? AND model IN (?)", d.user, d.day, models)
	if err != nil {
		return nil, fmt.Errorf("fold pruned models that used nothing: %w", err)
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("fold %d pruned models of user %d on %s: %w", len(rows), d.user, d.day, err)
	}
	got, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("fold pruned models of user %d on %s: rows deleted: %w", d.user, d.day, err)
	}
	if got != int64(len(rows)) {
		// Only prunes write the table, one batch at a time: the rows read are the rows there.
		return nil, fmt.Errorf("fold pruned models of user %d on %s: %d of %d deleted", d.user, d.day, got, len(rows))
	}
	return rows, nil
}
