package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// Ledger is the check after a tollgate scenario.
type Ledger struct {
	Pass         bool    `json:"pass"`
	DrainSeconds float64 `json:"drain_seconds"` // scenario end -> no hold left running
	LeftRunning  int     `json:"left_running"`
	BadDays      int     `json:"bad_days"`  // usage_days rows != sum of settled charges
	BadParts     int     `json:"bad_parts"` // charge parts that do not add up
	Unsettled    int     `json:"unsettled"` // answered calls (200) without a settled, charged run
	Detail       string  `json:"detail,omitempty"`
}

// waitSettled polls until no hold is queued or running, at most limit.
func waitSettled(ctx context.Context, db *sqlx.DB, limit time.Duration) (int, time.Duration, error) {
	t0 := time.Now()
	for {
		var n int
		if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM run_holds WHERE state IN ('queued','running')"); err != nil {
			return 0, time.Since(t0), fmt.Errorf("count holds still running: %w", err)
		}
		if n == 0 || time.Since(t0) > limit {
			return n, time.Since(t0), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkLedger is internal/testenv.CheckLedger without testing.TB: for each user and UTC day
// the day ledger equals the sum (and count) of the charges settled that day, and each
// charge's parts add up.
func checkLedger(ctx context.Context, db *sqlx.DB) Ledger {
	var l Ledger
	left, waited, err := waitSettled(ctx, db, 30*time.Second)
	l.LeftRunning, l.DrainSeconds = left, round3(waited.Seconds())
	if err != nil {
		l.Detail = err.Error()
		return l
	}
	bad, err := holds.Audit(ctx, db)
	if err != nil {
		l.Detail = err.Error()
		return l
	}
	var msgs []string
	for _, m := range bad {
		if m.RunID != "" {
			l.BadParts++
		} else {
			l.BadDays++
		}
		if len(msgs) < 3 {
			msgs = append(msgs, fmt.Sprintf("user %d %s%s: %s", m.UserID, m.Day, m.RunID, m.Detail))
		}
	}
	if l.LeftRunning > 0 {
		msgs = append(msgs, fmt.Sprintf("%d holds still running after %.0fs", l.LeftRunning, waited.Seconds()))
	}
	l.Detail = strings.Join(msgs, "; ")
	l.Pass = l.BadDays == 0 && l.BadParts == 0 && l.LeftRunning == 0
	return l
}

// unsettled counts the answered calls whose run is not settled with a charge: the day
// ledger can only agree with charges that were written, so this is what says every answered
// call was charged.
func unsettled(ctx context.Context, db *sqlx.DB, runIDs []string) (int, error) {
	charged := 0
	for i := 0; i < len(runIDs); i += 500 {
		batch := runIDs[i:min(len(runIDs), i+500)]
		q, args, err := sqlx.In("SELECT COUNT(DISTINCT run_id) FROM run_holds WHERE state = 'settled' AND charged_micro > 0 AND run_id IN (?)", batch)
		if err != nil {
			return 0, fmt.Errorf("count charged runs: %w", err)
		}
		var n int
		if err := db.GetContext(ctx, &n, q, args...); err != nil {
			return 0, fmt.Errorf("count charged runs: %w", err)
		}
		charged += n
	}
	return len(runIDs) - charged, nil
}

// settledAt returns run_holds.settled_at of the given runs (UTC, the database clock).
func settledAt(ctx context.Context, db *sqlx.DB, runIDs []string) (map[string]time.Time, error) {
	out := make(map[string]time.Time, len(runIDs))
	for i := 0; i < len(runIDs); i += 500 {
		batch := runIDs[i:min(len(runIDs), i+500)]
		q, args, err := sqlx.In("SELECT run_id, settled_at FROM run_holds WHERE settled_at IS NOT NULL AND run_id IN (?)", batch)
		if err != nil {
			return nil, fmt.Errorf("read settled_at: %w", err)
		}
		var rows []struct {
			RunID     string    `db:"run_id"`
			SettledAt time.Time `db:"settled_at"`
		}
		if err := db.SelectContext(ctx, &rows, q, args...); err != nil {
			return nil, fmt.Errorf("read settled_at: %w", err)
		}
		for _, r := range rows {
			out[r.RunID] = r.SettledAt
		}
	}
	return out, nil
}

// Balance is the drain user's check: nothing admitted beyond what the balance allowed.
type Balance struct {
	Pass            bool  `json:"pass"`
	Admitted        int   `json:"admitted"`         // 200 answers
	Refused402      int   `json:"refused_402"`      // insufficient credits
	Refused429      int   `json:"refused_429"`      // too many in flight
	OtherErrors     int   `json:"other_errors"`     //
	AllowanceMicro  int64 `json:"allowance_micro"`  //
	UsedMicro       int64 `json:"used_micro"`       // usage_days today
	PrepaidMicro    int64 `json:"prepaid_micro"`    // below 0 = overdraft taken
	OverHeldMicro   int64 `json:"over_held_micro"`  // Σ max(0, charged - held): the design's bounded overdraft
	OverCap         int   `json:"runs_over_cap"`    // charged > cap: must be 0
	SettledRuns     int   `json:"settled_runs"`     //
	MaxConcurrent   int   `json:"max_overlap_runs"` // most holds alive at one instant (from created/settled)
	MaxHeldTogether int64 `json:"max_held_together_micro"`
	// MaxOverAvailable: most held beyond max(0, allowance - used so far) right after an
	// admission; above 0 an admission took more than the balance allowed.
	MaxOverAvailable int64 `json:"max_held_over_available_micro"`
}

func checkBalance(ctx context.Context, db *sqlx.DB, userID uint64, allowance int64) (Balance, error) {
	b := Balance{AllowanceMicro: allowance}
	if _, _, err := waitSettled(ctx, db, 30*time.Second); err != nil {
		return b, err
	}
	if err := db.GetContext(ctx, &b.UsedMicro, "SELECT COALESCE(SUM(used_micro),0) FROM usage_days WHERE user_id = ?", userID); err != nil {
		return b, fmt.Errorf("balance of user %d: usage_days: %w", userID, err)
	}
	if err := db.GetContext(ctx, &b.PrepaidMicro, "SELECT prepaid_micro FROM users WHERE id = ?", userID); err != nil {
		return b, fmt.Errorf("balance of user %d: prepaid: %w", userID, err)
	}
	var agg struct {
		N       int   `db:"n"`
		OverH   int64 `db:"over_held"`
		OverCap int   `db:"over_cap"`
	}
	if err := db.GetContext(ctx, &agg, `SELECT COUNT(*) AS n, COALESCE(SUM(GREATEST(0, charged_micro - held_micro)),0) AS over_held,
		COALESCE(SUM(charged_micro > cap_micro),0) AS over_cap FROM run_holds WHERE user_id = ? AND state = 'settled'`, userID); err != nil {
		return b, fmt.Errorf("balance of user %d: settled holds: %w", userID, err)
	}
	b.SettledRuns, b.OverHeldMicro, b.OverCap = agg.N, agg.OverH, agg.OverCap
	// Holds alive together, from their own timestamps: a sweep over created_at/settled_at.
	// A settlement also adds its charge to what the day has used: admission allows
	// held + new hold <= max(0, allowance - used) + prepaid (prepaid <= 0 here), so the sweep
	// checks that bound at every admission, not only held <= allowance (which late in the
	// drain, with most of the allowance used, would let a whole second allowance be held).
	var evs []struct {
		T       time.Time `db:"t"`
		Held    int64     `db:"held"`
		Charged int64     `db:"charged"`
	}
	if err := db.SelectContext(ctx, &evs, `SELECT t, held, charged FROM (
		SELECT created_at AS t, held_micro AS held, 0 AS charged FROM run_holds WHERE user_id = ?
		UNION ALL SELECT settled_at AS t, -held_micro AS held, charged_micro AS charged FROM run_holds WHERE user_id = ? AND settled_at IS NOT NULL) e
		ORDER BY t, held`, userID, userID); err != nil {
		return b, fmt.Errorf("balance of user %d: hold events: %w", userID, err)
	}
	var n int
	var held, used int64
	day := ""
	for _, e := range evs {
		if d := e.T.UTC().Format(time.DateOnly); d != day {
			day, used = d, 0 // the allowance is per UTC day
		}
		if e.Held > 0 {
			n++
		} else {
			n--
			used += e.Charged
		}
		held += e.Held
		b.MaxConcurrent, b.MaxHeldTogether = max(b.MaxConcurrent, n), max(b.MaxHeldTogether, held)
		if e.Held > 0 {
			b.MaxOverAvailable = max(b.MaxOverAvailable, held-max(0, allowance-used))
		}
	}
	// Everything charged beyond the allowance must come from calls that cost more than their
	// hold (the design's bounded overdraft), no call may be charged past its cap, and no
	// admission may hold more than was left (slack: the overdraft, which a settlement ordered
	// before an admission that had not seen it can add).
	b.Pass = b.UsedMicro <= allowance+b.OverHeldMicro && b.OverCap == 0 && b.MaxHeldTogether <= allowance &&
		b.MaxOverAvailable <= b.OverHeldMicro
	return b, nil
}

// round3 rounds to the microsecond (of a millisecond figure), half away from zero: a negative
// lag rounds like a positive one.
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// dbCounters reads server status counters that explain where a tollgate request's database
// time goes: statements, commits, fsyncs, row-lock waits. Fsyncs are Innodb_data_fsyncs (every
// InnoDB fsync, the redo log's included): MariaDB 10.8+ no longer has Innodb_os_log_fsyncs.
func dbCounters(ctx context.Context, db *sqlx.DB) map[string]float64 {
	var rows []struct {
		Name  string `db:"Variable_name"`
		Value string `db:"Value"`
	}
	if err := db.SelectContext(ctx, &rows, `SHOW GLOBAL STATUS WHERE Variable_name IN
		('Questions','Com_commit','Com_select','Com_insert','Com_update','Innodb_data_fsyncs',
		 'Innodb_row_lock_waits','Innodb_row_lock_time')`); err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, r := range rows {
		var v float64
		fmt.Sscan(r.Value, &v)
		out[strings.ToLower(r.Name)] = v
	}
	return out
}

// perRequest turns two counter readings into per-request figures (row-lock time in ms).
func perRequest(before, after map[string]float64, n int) map[string]float64 {
	if before == nil || after == nil || n == 0 {
		return nil
	}
	out := map[string]float64{}
	for k, a := range after {
		out[k] = round3((a - before[k]) / float64(n))
	}
	return out
}
