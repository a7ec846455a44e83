package holds

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/internal/token"
)

// MaxModelLen is the longest model name a hold records (run_holds.model): callers refuse
// longer ones, since one of them would fail its whole batch.
const MaxModelLen = 128

// MaxBatch bounds one batch transaction, settlements and admissions together: its statements
// grow with it, and so does the time its user locks are held.
const MaxBatch = 256

// WriteBatch settles sts and then admits reqs in one transaction, in the global lock order:
// the users' rows of both (in id order, so two batches never wait on each other in a cycle),
// the holds to settle, their named runs' call keys (run_calls: a call's record takes its
// run's row before its key, RecordRunCall), then the day ledger. The new holds are inserted
// after the ledger upsert; that takes no lock anyone could wait on in another order, since a
// new run id is this transaction's alone and READ COMMITTED takes no gap locks on the
// secondary indexes.
// Each part decides its items in batch order, as separate transactions in that order would.
//
// Settlements go first so that an admission sees the credits they free. Sharing the
// transaction is what lets a caller's next call pay for its previous call's settlement: both
// lock the same user row, and apart they cost two commits in a row on the caller's path (the
// admission waits for the settlement's lock); together they cost one.
//
// The transaction takes two round trips whatever the batch holds: one script that begins,
// reads the clock, takes the locks and reads everything the decisions need, and one that
// writes them and commits (see readBatch). Under load every round trip is a wait for a
// scheduler on a busy machine, so their number, more than the statements' work, is what an
// admission costs its caller.
//
// The error is for the whole batch (nothing committed); refusals and unknown runs are per item.
func (s *Store) WriteBatch(ctx context.Context, sts []Settlement, reqs []AdmitRequest) ([]BatchResult, []AdmitResult, error) {
	settled, admitted, err := s.writeBatch(ctx, sts, reqs)
	if err == nil {
		s.tellSettled(sts, settled)
	}
	return settled, admitted, err
}

// writeBatch is WriteBatch without telling the SettledHook: what the Writer runs where a
// panic is recovered (Writer.writeBatch), which must never be one after the batch committed.
func (s *Store) writeBatch(ctx context.Context, sts []Settlement, reqs []AdmitRequest) ([]BatchResult, []AdmitResult, error) {
	checkBatch(sts, reqs)
	what := batchName(sts, reqs)
	tokens := settleTokens(sts)
	settleUsers, err := s.usersOf(ctx, sts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	plan := planBatch(sts, settleUsers, reqs)
	if len(plan.userIDs) == 0 {
		// Nothing known to lock: every item is refused without a transaction.
		r := &batchReads{users: map[uint64]userRow{}}
		settled, _ := s.decideSettlements(sts, tokens, settleUsers, r)
		admitted, _ := s.decideAdmissions(reqs, r)
		return settled, admitted, nil
	}
	var settled []BatchResult
	var admitted []AdmitResult
	// sent holds the admissions of attempts whose writes and COMMIT went out unanswered (the
	// reply lost with the connection): they may be committed. A retry looks them up and claims
	// those it finds carrying their request's token, rather than refusing them as duplicates
	// and leaving holds nobody will release.
	sent := map[string]bool{}
	// settleSent: an attempt's settlement writes and COMMIT went out unanswered, so a batch
	// that then fails may have settled its runs (the retry that would have found out never
	// got through). Its caller must not act as if nothing was charged: a run settled on
	// request stays closed to new calls (see proxy.settleRun).
	settleSent := false
	// A batch of settlements alone refused for want of room waits for it (outOfRoomError), if
	// its writer has a room slot free (roomWait).
	var room roomWait
	defer room.release()
	err = s.withRetryLogged(ctx, what, []zap.Field{zap.Strings("run_ids", batchRuns(sts, reqs))}, func() error {
		var err error
		settled, admitted, err = s.tryWriteBatch(ctx, plan, sts, tokens, settleUsers, reqs, sent, &settleSent)
		if len(reqs) == 0 && isOutOfRoom(err) && room.take(ctx) {
			err = waitForRoom(err)
		}
		return err
	})
	if err != nil {
		return nil, nil, batchError(what, err, sent, settleSent, len(reqs) > 0)
	}
	return settled, admitted, nil
}

// checkBatch panics on a batch no caller sends, a programming mistake: empty or past
// MaxBatch, a negative cost, a model name past MaxModelLen (callers refuse longer ones, since
// one would fail its whole batch), an admission in a state other than queued or running or
// without a TTL.
func checkBatch(sts []Settlement, reqs []AdmitRequest) {
	n := len(sts) + len(reqs)
	if n == 0 || n > MaxBatch {
		panic(fmt.Sprintf("holds: batch of %d settlements and %d admissions", len(sts), len(reqs)))
	}
	for _, st := range sts {
		if st.CostMicro < 0 {
			panic("holds: negative cost")
		}
		if len(st.Model) > MaxModelLen {
			panic(fmt.Sprintf("holds: model name of %d bytes", len(st.Model)))
		}
	}
	for _, req := range reqs {
		if len(req.Model) > MaxModelLen {
			panic(fmt.Sprintf("holds: model name of %d bytes", len(req.Model)))
		}
		if req.State != StateQueued && req.State != StateRunning {
			panic(fmt.Sprintf("holds: admit in state %q", req.State))
		}
		if req.TTL <= 0 {
			panic("holds: admit without a TTL")
		}
	}
}

// settleTokens draws each settlement's token. The token marks the row it settles, the same in
// every attempt: a retry after a lost COMMIT reply recognises its own settlement (see
// decideSettlements). The Writer's, set before its first batch, is kept into its retry of the
// settlements alone.
func settleTokens(sts []Settlement) []string {
	tokens := make([]string, len(sts))
	for i := range tokens {
		tokens[i] = sts[i].token
		if tokens[i] == "" {
			tokens[i] = token.New()
		}
	}
	return tokens
}

// batchError is the error of a batch whose every attempt failed with err. sent and settleSent
// are what its attempts' unanswered writes may have committed (see WriteBatch); admits says
// the batch carried admissions.
func batchError(what string, err error, sent map[string]bool, settleSent, admits bool) error {
	err = fmt.Errorf("%s: %w", what, err)
	// Admissions are told each their own (OutcomeUnknownError.forRun), even when only the
	// settlements' writes went out unanswered: the settlements' ErrOutcomeUnknown below
	// would otherwise reach every admission, and send callers that held nothing to
	// release a hold.
	if len(sent) > 0 || (settleSent && admits) {
		err = &OutcomeUnknownError{Runs: sent, Err: err}
	}
	if settleSent {
		err = fmt.Errorf("settlements: %w: %w", ErrOutcomeUnknown, err)
	}
	return err
}

// tellSettled tells the store's SettledHook of each settlement the batch committed, and logs
// each whose cost the cap clamped: the operator pays what passed it, and the row's cost beside
// its charge would be the only word of it.
func (s *Store) tellSettled(sts []Settlement, settled []BatchResult) {
	for i, r := range settled {
		if r.Err != nil || !r.Applied {
			continue
		}
		if r.UnchargedMicro > 0 {
			s.log.Named(MoneyLog).Warn("cost past the run's cap not charged", zap.String("run_id", sts[i].RunID), zap.Uint64("user_id", r.UserID),
				zap.String("model", sts[i].Model), zap.String("source", sts[i].Source), zap.Int64("cost_micro", r.CostMicro),
				zap.Int64("charged_micro", r.ChargedMicro), zap.Int64("uncharged_micro", r.UnchargedMicro))
		}
		if s.onSettled != nil {
			s.onSettled(sts[i], r.Settled)
		}
	}
}

// batchPlan is what a batch must lock and read.
type batchPlan struct {
	userIDs    []uint64 // every user of the batch, distinct
	admitIDs   []uint64 // the users with admissions, distinct: their live holds are aggregated
	lockRuns   []string // the holds to settle, locked
	lookupRuns []string // runs that may have been admitted before (not Fresh)
}

func planBatch(sts []Settlement, settleUsers []uint64, reqs []AdmitRequest) batchPlan {
	var p batchPlan
	ids := make([]uint64, 0, len(sts)+len(reqs))
	admitIDs := make([]uint64, 0, len(reqs))
	for i, st := range sts {
		if settleUsers[i] != 0 {
			ids = append(ids, settleUsers[i])
			p.lockRuns = append(p.lockRuns, st.RunID)
		}
	}
	for _, r := range reqs {
		ids = append(ids, r.UserID)
		admitIDs = append(admitIDs, r.UserID)
		if !r.Fresh {
			p.lookupRuns = append(p.lookupRuns, r.RunID)
		}
	}
	p.userIDs = distinctNonZero(ids)
	p.admitIDs = distinctNonZero(admitIDs)
	return p
}

// distinctNonZero is ids without zeros and repeats, in the order they first appear.
func distinctNonZero(ids []uint64) []uint64 {
	seen := make(map[uint64]bool, len(ids))
	var out []uint64
	for _, id := range ids {
		if id != 0 && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// tryWriteBatch runs the batch's transaction once, on a connection of its own. sent is what
// earlier attempts may have committed (see WriteBatch); this attempt adds to it when its own
// writes go out unanswered, and sets settleSent when they carried settlements.
func (s *Store) tryWriteBatch(ctx context.Context, plan batchPlan, sts []Settlement, tokens []string, settleUsers []uint64,
	reqs []AdmitRequest, sent map[string]bool, settleSent *bool) (settled []BatchResult, admitted []AdmitResult, err error) {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connection: %w", endedByServer(err))
	}
	committed := false
	defer func() { s.releaseConn(conn, committed, err) }()

	if len(sent) > 0 {
		plan.lookupRuns = appendMissing(plan.lookupRuns, sent)
	}
	r, err := readBatch(ctx, conn, plan)
	if err != nil {
		return nil, nil, endedByServer(err)
	}
	settled, sw := s.decideSettlements(sts, tokens, settleUsers, r)
	admitted, inserts := s.decideAdmissions(reqs, r)

	var w script
	appendExtendHolds(&w, inserts)
	appendSettled(&w, sw, r.now)
	appendInsertHolds(&w, inserts)
	w.add("COMMIT")
	// Once the writes are sent their outcome must be learnt, not abandoned: a deadline that
	// closed the connection now would leave a commit nobody knows of. The driver's read
	// timeout still bounds the wait.
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), string(w.q), w.args...); err != nil {
		// The driver answers driver.ErrBadConn only when it sent none of the script (the
		// connection was found closed, as the server's idle_transaction_timeout leaves it
		// under a gateway that was paused): the transaction dies with its connection, nothing
		// committed, and the batch may simply be tried again. A script the server ended
		// (serverEndedError) may have committed, as one whose reply was lost; one it refused
		// read_only (readOnlyError) did not, its COMMIT refused or never run.
		err = endedByServer(err)
		var ro *readOnlyError
		if isUnavailable(err) && !errors.Is(err, driver.ErrBadConn) && !errors.As(err, &ro) {
			for _, in := range inserts {
				if !in.existing {
					sent[in.hold.RunID] = true
				}
			}
			if len(sw.changed) > 0 {
				*settleSent = true
			}
		}
		return nil, nil, fmt.Errorf("write and commit: %w", err)
	}
	committed = true
	return settled, admitted, nil
}

// appendMissing adds the runs of sent not yet in runs.
func appendMissing(runs []string, sent map[string]bool) []string {
	have := make(map[string]bool, len(runs))
	for _, r := range runs {
		have[r] = true
	}
	out := append([]string(nil), runs...)
	for r := range sent {
		if !have[r] {
			out = append(out, r)
		}
	}
	return out
}

// releaseConn returns a batch's connection to the pool; failed is the batch's error. A
// transaction that did not commit may still be open on it (a statement failed, a lock wait
// timed out): roll it back, and if even that fails, discard the connection, so that no later
// user of the pool finds itself inside a stale transaction holding user locks. A connection
// refused as taking no writes leaves the pool with every idle one (dropReadOnly); closing it
// ends its transaction.
func (s *Store) releaseConn(conn *sqlx.Conn, committed bool, failed error) {
	if isReadOnly(failed) {
		s.dropReadOnly(conn)
		return
	}
	if !committed {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := conn.ExecContext(ctx, "ROLLBACK")
		cancel()
		if err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = conn.Close()
}

// batchReads is what the first round trip of a batch returned.
type batchReads struct {
	now      time.Time               // the database clock, read once per transaction
	users    map[uint64]userRow      // locked; absent: no such user
	holds    map[string]*lockedHold  // the holds to settle, locked; absent: no such run
	existing map[string]existingHold // earlier admissions of runs admitted again
	live     map[uint64]*liveTotals  // per user: live holds (admission users) and today's ledger
}

// existingHold is an earlier admission of a run admitted again, as the batch's lookup reads it
// (or as an admission earlier in the same batch took it).
type existingHold struct {
	RunID      string
	UserID     uint64
	State      State
	HeldMicro  int64
	CapMicro   int64
	DiscountBP int
	Token      sql.NullString // the admission's token, if it had one
	// CostMicro is what the row records as used: for a live named run, its ended calls
	// (RecordRunCall).
	CostMicro int64
	// Live: open and unexpired at the batch's clock, so the admission aggregate counted it.
	Live bool
}

// readBatch sends the batch's first script: begin, read the clock, lock the users (in id
// order), lock the holds to settle, read earlier admissions of runs admitted again, aggregate
// the admission users' live holds, and read every user's day ledger. Statements of one
// script run one after another, so every read after the user lock starts once the locks are
// granted, and every writer of a hold's state, of a new hold and of a ledger row holds its
// user's lock: the reads are current. (Extend changes a live hold's expiry without it; an
// aggregate may leave out of the in-flight count a hold whose expiry is pushed back at that
// moment, as the design's single-transaction admission could; what it holds is counted
// whatever its expiry.) The clock is read before the lock wait, as a single statement's NOW() would be.
func readBatch(ctx context.Context, conn *sqlx.Conn, plan batchPlan) (*batchReads, error) {
	sc := batchReadScript(plan)
	rows, err := conn.QueryContext(ctx, string(sc.q), sc.args...)
	if err != nil {
		return nil, fmt.Errorf("begin and lock: %w", err)
	}
	defer rows.Close()
	sets := resultSets{rows: rows}
	r := newBatchReads(plan)

	if err := sets.each("read clock", func() error { return rows.Scan(&r.now) }); err != nil {
		return nil, err
	}
	if err := sets.each("lock users", func() error { return r.scanUser(rows) }); err != nil {
		return nil, err
	}
	if len(plan.lockRuns) > 0 {
		if err := sets.each("lock holds", func() error { return r.scanHold(rows) }); err != nil {
			return nil, err
		}
	}
	if len(plan.lookupRuns) > 0 {
		if err := sets.each("read admitted runs", func() error { return r.scanExisting(rows) }); err != nil {
			return nil, err
		}
	}
	if len(plan.admitIDs) > 0 {
		if err := sets.each("aggregate live holds", func() error { return r.addTotals(rows) }); err != nil {
			return nil, err
		}
	}
	if err := sets.each("read day ledger", func() error { return r.addTotals(rows) }); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("finish reads: %w", err)
	}
	return r, nil
}

// newBatchReads is where readBatch puts what it reads for plan: every user's totals start at
// zero, the admission users' marked as aggregated.
func newBatchReads(plan batchPlan) *batchReads {
	r := &batchReads{users: make(map[uint64]userRow, len(plan.userIDs)), holds: map[string]*lockedHold{},
		existing: map[string]existingHold{}, live: make(map[uint64]*liveTotals, len(plan.userIDs))}
	for _, id := range plan.userIDs {
		r.live[id] = &liveTotals{UserID: id}
	}
	for _, id := range plan.admitIDs {
		r.live[id].Aggregated = true
	}
	return r
}

// scanUser reads one row of "lock users".
func (r *batchReads) scanUser(rows *sql.Rows) error {
	var u userRow
	if err := rows.Scan(&u.ID, &u.Name, &u.Plan, &u.AllowanceMicro, &u.PrepaidMicro, &u.DiscountBP, &u.MaxInFlight, &u.DisabledAt); err != nil {
		return err
	}
	r.users[u.ID] = u
	return nil
}

// scanHold reads one row of "lock holds".
func (r *batchReads) scanHold(rows *sql.Rows) error {
	var h lockedHold
	if err := rows.Scan(&h.RunID, &h.UserID, &h.State, &h.HeldMicro, &h.CapMicro, &h.DiscountBP, &h.ExpiresAt, &h.Counted, &h.Token,
		&h.SettleToken, &h.Settled.ChargedMicro, &h.Settled.AllowancePart, &h.Settled.PrepaidPart, &h.Settled.CostMicro,
		&h.HasSnapshot, &h.Named); err != nil {
		return err
	}
	h.Settled.UserID = h.UserID
	r.holds[h.RunID] = &h
	return nil
}

// scanExisting reads one row of "read admitted runs".
func (r *batchReads) scanExisting(rows *sql.Rows) error {
	var h existingHold
	if err := rows.Scan(&h.RunID, &h.UserID, &h.State, &h.HeldMicro, &h.CapMicro, &h.DiscountBP, &h.Token, &h.Live, &h.CostMicro); err != nil {
		return err
	}
	r.existing[h.RunID] = h
	return nil
}

// addTotals adds one row of "aggregate live holds" or "read day ledger" to its user's totals:
// both read as user_id, in flight, held, used today, open runs, each leaving 0 where it has
// nothing.
func (r *batchReads) addTotals(rows *sql.Rows) error {
	var t liveTotals
	if err := rows.Scan(&t.UserID, &t.InFlight, &t.Held, &t.UsedToday, &t.OpenRuns); err != nil {
		return err
	}
	l := r.live[t.UserID]
	l.InFlight += t.InFlight
	l.OpenRuns += t.OpenRuns
	l.Held += t.Held
	l.UsedToday += t.UsedToday
	return nil
}

// batchReadScript is the script readBatch sends: its result sets come in the order readBatch
// reads them, the optional ones only when the plan has something for them.
func batchReadScript(plan batchPlan) script {
	var sc script
	sc.add("START TRANSACTION")
	sc.add("SET @tg_now = NOW(6)")
	sc.add("SELECT CAST(@tg_now AS DATETIME(6))")
	sc.addIn("SELECT "+userColumns+" FROM users WHERE id IN (?) ORDER BY id FOR UPDATE", plan.userIDs)
	if len(plan.lockRuns) > 0 {
		sc.addIn(`SELECT run_id, user_id, state, held_micro, cap_micro, discount_bp,
			DATE_FORMAT(GREATEST(expires_at, TIMESTAMP'1000-01-01 00:00:00'), '%Y-%m-%d %H:%i:%s.%f'), state IN ('queued', 'running') AND expires_at > @tg_now, admit_token,
			settle_token, charged_micro, allowance_part_micro, prepaid_part_micro, cost_micro, price_snapshot IS NOT NULL,
			client_run_id IS NOT NULL
			FROM run_holds WHERE run_id IN (?) FOR UPDATE`, plan.lockRuns)
	}
	if len(plan.lookupRuns) > 0 {
		sc.addIn(`SELECT run_id, user_id, state, held_micro, cap_micro, discount_bp, admit_token,
			state IN ('queued', 'running') AND expires_at > @tg_now, cost_micro FROM run_holds WHERE run_id IN (?)`, plan.lookupRuns)
	}
	if len(plan.admitIDs) > 0 {
		// In flight: the unexpired holds. Held: every unsettled one — a hold past its expiry
		// that the reconciler has not settled yet (its process killed, its run idle) is still
		// owed, at its hold or its tally: not counting it let the next admissions spend the
		// same credits again, past the overdraft bound of DESIGN §3.
		// Held counts each hold at owedMicro: a named run's calls that have used more than
		// its hold have spent credits a new admission must not be given.
		// Open runs: the unexpired holds of named runs, which keep their slot between their
		// calls; a refusal past the limit says how many there are (TooManyInFlightError).
		sc.addIn(`SELECT user_id, SUM(expires_at > @tg_now), SUM(`+owedSQL+`), 0,
			SUM(expires_at > @tg_now AND client_run_id IS NOT NULL)
			FROM run_holds WHERE user_id IN (?) AND state IN ('queued', 'running')
			GROUP BY user_id`, plan.admitIDs)
	}
	sc.addIn("SELECT user_id, 0, 0, used_micro, 0 FROM usage_days WHERE day = DATE(@tg_now) AND user_id IN (?)", plan.userIDs)
	return sc
}

// resultSets walks the result sets of a script in order. Statements without a result (START
// TRANSACTION, SET) have none: the driver skips them, and opens the rows on the first
// statement that has one.
type resultSets struct {
	rows    *sql.Rows
	started bool
}

// each moves to the next result set and calls scan on each of its rows.
func (s *resultSets) each(what string, scan func() error) error {
	rows := s.rows
	if s.started && !rows.NextResultSet() {
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: no result", what)
	}
	s.started = true
	for rows.Next() {
		if err := scan(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// script is several statements sent in one round trip, with their parameters in order.
type script struct {
	q    []byte
	args []any
}

func (s *script) add(q string, args ...any) {
	if len(s.q) > 0 {
		s.q = append(s.q, ";\n"...)
	}
	s.q = append(s.q, q...)
	s.args = append(s.args, args...)
}

// addIn adds a statement whose slice arguments expand into IN lists.
func (s *script) addIn(q string, args ...any) {
	q, args, err := sqlx.In(q, args...)
	if err != nil {
		panic(fmt.Sprintf("holds: %v", err)) // only an empty list gets here, and callers never pass one
	}
	s.add(q, args...)
}

// batchName names a batch in errors and logs by its size and first run.
func batchName(sts []Settlement, reqs []AdmitRequest) string {
	first := ""
	if len(sts) > 0 {
		first = sts[0].RunID
	} else {
		first = reqs[0].RunID
	}
	return fmt.Sprintf("batch of %d settlements, %d admissions (first %s)", len(sts), len(reqs), first)
}

// batchRuns is the run ids of a batch, settlements first, for its retry logs.
func batchRuns(sts []Settlement, reqs []AdmitRequest) []string {
	runs := make([]string, 0, len(sts)+len(reqs))
	for _, st := range sts {
		runs = append(runs, st.RunID)
	}
	for _, r := range reqs {
		runs = append(runs, r.RunID)
	}
	return runs
}
