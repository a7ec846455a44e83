package holds

import (
	"context"
	"time"
)

// SetMaxReportRows lowers the usage report's row bound for a test and restores it after.
func SetMaxReportRows(n int) (restore func()) {
	old := maxReportRows
	maxReportRows = n
	return func() { maxReportRows = old }
}

// SetRetry replaces the store's retry policy (tests shorten it).
func (s *Store) SetRetry(p RetryPolicy) { s.retry = p }

// Gathered is how many items wait in the batch being formed (tests wait on it; it is not
// a queue length: items still in the channel are not counted).
func (w *Writer) Gathered() int { return int(w.gathered.Load()) }

// AuditQueries are the statements Audit reads the whole books with (tests EXPLAIN them).
var AuditQueries = map[string]string{"days": auditDaysQuery, "prepaid": auditPrepaidQuery}

// SetDefaultReadTimeout shortens the read timeout Open gives a DSN without one, until the
// returned func restores it.
func SetDefaultReadTimeout(d time.Duration) (restore func()) {
	old := defaultReadTimeout
	defaultReadTimeout = d
	return func() { defaultReadTimeout = old }
}

// ExpiredQuery is the reconciler's scan statement for a batch of limit, from the start or after
// the given hold.
func ExpiredQuery(afterExpiry time.Time, afterRun string, limit int) (string, []any) {
	return expiredQuery(expiredCursor{ExpiresAt: afterExpiry, RunID: afterRun}, limit)
}

// ChargedHeldQuery is the statement a pass lists the runs charged their hold with (refundPaused),
// for a batch of limit within window, from the start or after the given run.
func ChargedHeldQuery(afterSettled time.Time, afterRun string, window time.Duration, limit int) (string, []any) {
	return chargedHeldQuery(heldCursor{SettledAt: afterSettled, RunID: afterRun}, window, limit)
}

// Watch has the instance read the other rows' beats now, as its heartbeat and a pass do.
func (in *Instance) Watch(ctx context.Context) error { return in.watch(ctx) }

// SkewWatch moves the instance's watch clock on by d: a beat it read that does not move
// meanwhile has then stood still d longer.
func (in *Instance) SkewWatch(d time.Duration) { in.skew.Add(int64(d)) }

// SkewBeats moves the clock of the instance's beat streak (BeatingFor) on by d, as if its
// last beat were d older.
func (in *Instance) SkewBeats(d time.Duration) { in.beatSkew.Add(int64(d)) }

// Gap is the longest this process's beat may stand still while it lives (its row's max_gap_us).
func (in *Instance) Gap() time.Duration { return in.gap() }

// SetMaxDeadPerPass lowers the dead instances one pass handles, until the returned func
// restores it.
func SetMaxDeadPerPass(n int) (restore func()) {
	old := maxDeadPerPass
	maxDeadPerPass = n
	return func() { maxDeadPerPass = old }
}

// SetItemTimeout shortens the time a pass gives one hold (and its sessions' prune).
func (r *Reconciler) SetItemTimeout(d time.Duration) { r.itemTimeout = d }

// TwinsReported is how many twin rows the instance remembers having reported.
func (in *Instance) TwinsReported() int {
	in.seenMu.Lock()
	defer in.seenMu.Unlock()
	return len(in.twins)
}

// MaxListRows is the most rows one listing reads (maxListRows).
const MaxListRows = maxListRows

// Queued is how many lookups wait in the key lookup's queue for a worker.
func (k *KeyLookup) Queued() int { return len(k.b.in) }
