package holds_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// commitScript is what only the closing script of a batch contains.
const commitScript = ";\nCOMMIT"

// newLossyFixture is newSettleFixture on a network that can lose MySQL's replies.
func newLossyFixture(t *testing.T) (*settleFixture, *testenv.Lossy) {
	f, lossy, _ := newLossyFixtureDSN(t)
	return f, lossy
}

// newLossyFixtureDSN is newLossyFixture that also returns its database's DSN.
func newLossyFixtureDSN(t *testing.T) (*settleFixture, *testenv.Lossy, string) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	u, err := st.CreateUser(context.Background(), "lossy-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	return &settleFixture{t: t, store: st, user: u}, lossy, dsn
}

// holdRows counts a run's rows and returns its state.
func holdRows(t *testing.T, st *holds.Store, runID string) (int, string) {
	t.Helper()
	var rows []string
	if err := st.DB().Select(&rows, "SELECT state FROM run_holds WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		return 0, ""
	}
	return len(rows), rows[0]
}

// TestLostCommitReplyIsClaimedByTheRetry: the server commits an admission but its reply is
// lost with the connection. The retry must find that hold and hand it to its caller — a
// refusal would leave a hold nobody releases, which the reconciler would charge — whether
// the run id was fresh or named.
func TestLostCommitReplyIsClaimedByTheRetry(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		name := map[bool]string{true: "fresh run id", false: "named run"}[fresh]
		t.Run(name, func(t *testing.T) {
			f, lossy := newLossyFixture(t)
			ctx := context.Background()
			run := admitThroughUnansweredCommit(t, f, lossy, testenv.LoseReply, fresh)
			if res, err := f.store.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 3_000, Source: holds.SourceComplete}); err != nil || !res.Applied {
				t.Fatalf("settle the claimed hold: %+v, %v", res, err)
			}
		})
	}
}

// TestLostCommitReplyOfASettlementChargesOnce: a settlement whose commit reply is lost is
// retried; the retry finds the run settled and changes nothing. The run was settled by this
// very settlement, so it is told so (applied, with what was charged): the metrics and the
// reconciler's alert on charges at the hold count it as applied, not as settled by someone else.
func TestLostCommitReplyOfASettlementChargesOnce(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	f.admit("r_lost_settle")
	lossy.Arm(commitScript, testenv.LoseReply)
	res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_lost_settle", CostMicro: 7_000, Source: holds.SourceComplete})
	if err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("the settlement's commit reply was never lost")
	}
	if !res.Applied || res.ChargedMicro != 7_000 || res.AllowancePart != 7_000 || res.CostMicro != 7_000 {
		t.Errorf("settlement whose commit reply was lost answered %+v; want applied, charged 7,000", res)
	}
	// A second settlement of the run, a different one, is told the run was settled before.
	if res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_lost_settle", CostMicro: 7_000, Source: holds.SourceComplete}); err != nil || res.Applied {
		t.Errorf("another settlement of a settled run: %+v, %v; want not applied", res, err)
	}
	if bal, err := testenv.BalanceAllDays(ctx, f.store, f.user.ID); err != nil || bal.UsedTodayMicro != 7_000 || bal.InFlight != 0 {
		t.Fatalf("balance %+v, %v: want one charge of 7,000", bal, err)
	}
}

// TestWriteScriptOutlivesTheBatchDeadline: a batch's deadline passing while its writes and
// COMMIT are on the wire must not abandon them: the caller learns the outcome the database
// reached, here a committed hold.
func TestWriteScriptOutlivesTheBatchDeadline(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	// The deadline also bounds the batch's reads before its writes, which must be sent in
	// time: at LateBy/2 (150 ms) a loaded machine could run out of it before the writes went
	// out, and the admission failed at "begin and lock". The COMMIT's reply, late by the
	// deadline's whole length, comes after it however soon the writes were sent.
	const admitTimeout = 2 * time.Second
	w := holds.NewWriter(f.store, holds.WriterConfig{Workers: 1, AdmitTimeout: admitTimeout, SettleTimeout: 10 * time.Second})
	defer w.Close()
	lossy.ArmLate(commitScript, admitTimeout)
	h, err := w.Admit(ctx, holds.AdmitRequest{RunID: "r_late_commit", UserID: f.user.ID, State: holds.StateRunning, TTL: time.Minute,
		Fresh: true, Token: testenv.RandomID(16)})
	if err != nil {
		t.Fatalf("admission whose commit outlived the deadline: %v", err)
	}
	if !lossy.Fired() {
		t.Fatal("the commit's reply was never delayed")
	}
	if n, state := holdRows(t, f.store, h.RunID); n != 1 || state != string(holds.StateRunning) {
		t.Fatalf("%d rows for the run, state %q", n, state)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: h.RunID, Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestLostCommitIsClaimedEvenIfTheUserWasDisabledMeanwhile: the hold committed before the
// reply was lost is the caller's; a retry that refused it because the user was disabled in
// between would leave a hold nobody releases.
func TestLostCommitIsClaimedEvenIfTheUserWasDisabledMeanwhile(t *testing.T) {
	f, lossy, dsn := newLossyFixtureDSN(t)
	f.store.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net = "tcp" // the admin's way in, around the lossy network
	admin, err := holds.Open(ctx, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	lossy.Arm(commitScript, testenv.GoDown)
	type result struct {
		h   holds.Hold
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: "r_disabled_between", UserID: f.user.ID, State: holds.StateRunning,
			TTL: time.Minute, Fresh: true, Token: testenv.RandomID(16)})
		done <- result{h, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !lossy.Down() {
		if time.Now().After(deadline) {
			t.Fatal("the commit was never sent")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := admin.ExecContext(ctx, "UPDATE users SET disabled_at = NOW(6) WHERE id = ?", f.user.ID); err != nil {
		t.Fatal(err)
	}
	lossy.Restore()
	r := <-done
	if r.err != nil || r.h.HeldMicro != 20_000 {
		t.Fatalf("retry after the user was disabled: %+v, %v; want the committed hold", r.h, r.err)
	}
	if _, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_disabled_between", Source: holds.SourceComplete}); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseByTokenClosesOnlyItsOwnHold: a settlement carrying an admission token applies
// only to the hold that admission took.
func TestReleaseByTokenClosesOnlyItsOwnHold(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	if _, err := f.store.Admit(ctx, holds.AdmitRequest{RunID: "r_tokened", UserID: f.user.ID, State: holds.StateRunning,
		TTL: time.Minute, Token: "aaaa"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_tokened", UserID: f.user.ID, AdmitToken: "bbbb", Source: holds.SourceAdmitLost})
	if !errors.Is(err, holds.ErrRunNotFound) {
		t.Fatalf("release with another request's token: %v, want ErrRunNotFound", err)
	}
	if bal, err := f.store.Balance(ctx, f.user.ID); err != nil || bal.InFlight != 1 {
		t.Fatalf("balance %+v, %v: the hold must still be live", bal, err)
	}
	res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_tokened", UserID: f.user.ID, AdmitToken: "aaaa", Source: holds.SourceAdmitLost})
	if err != nil || !res.Applied || res.ChargedMicro != 0 {
		t.Fatalf("release with its own token: %+v, %v", res, err)
	}
}

// TestOwnHoldSettledBeforeItsClaimIsNotHandedBack: an admission whose hold an earlier attempt
// committed (its reply lost) claims that hold by its token, but not once the run has settled
// meanwhile (a named run settled by the client between the attempts): the caller is told
// ErrRunSettled. A settled hold handed back as its own lets the call forward on it, and its
// settlement then charges nothing: a free call.
func TestOwnHoldSettledBeforeItsClaimIsNotHandedBack(t *testing.T) {
	f := newSettleFixture(t)
	ctx := context.Background()
	req := holds.AdmitRequest{RunID: "r_claim_settled", UserID: f.user.ID, ClientRunID: "claim-settled", State: holds.StateRunning,
		TTL: time.Minute, Token: testenv.RandomID(16)}
	if _, err := f.store.Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if res, err := f.store.Settle(ctx, holds.Settlement{RunID: req.RunID, UserID: f.user.ID, CostMicro: 4_000, Source: holds.SourceClient}); err != nil || !res.Applied {
		t.Fatalf("settle the run: %+v, %v", res, err)
	}
	// The retry of the same request, carrying its token.
	h, err := f.store.Admit(ctx, req)
	if !errors.Is(err, holds.ErrRunSettled) {
		t.Fatalf("claim of the request's own hold after its run settled: %+v, %v; want ErrRunSettled", h, err)
	}
}

// TestLostCommitReplyOfAGrantIsAnsweredAsCreated: the server commits a grant but its reply is
// lost with the connection. The retry inside the same call finds the grant by its key; it is
// this call's own, so the call answers created (an operator's script told "replayed" would
// take the credit for an earlier delivery's and look for it in vain), and credits once.
func TestLostCommitReplyOfAGrantIsAnsweredAsCreated(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	req := holds.GrantRequest{UserID: f.user.ID, AmountMicro: 5_000, IdempotencyKey: "evt_lost_" + testenv.RandomID(4), Reason: "top-up"}
	lossy.Arm("COMMIT", testenv.LoseReply)
	g, created, err := f.store.Grant(ctx, req)
	if !lossy.Fired() {
		t.Fatal("the grant's commit reply was never lost")
	}
	if err != nil || !created || g.AmountMicro != 5_000 {
		t.Fatalf("grant whose commit reply was lost: %+v created=%v, %v; want created", g, created, err)
	}
	// A later delivery of the same webhook is a replay, and nothing is credited twice.
	if _, created, err := f.store.Grant(ctx, req); err != nil || created {
		t.Fatalf("second delivery: created=%v, %v; want a replay", created, err)
	}
	if bal, err := f.store.Balance(ctx, f.user.ID); err != nil || bal.PrepaidMicro != 5_000 {
		t.Fatalf("balance %+v, %v: want prepaid 5,000", bal, err)
	}
}

// TestLostCommitReplyOfAClampedSettlementKeepsWhatTheCapClampedAway: a settlement whose cost
// passes its hold's cap charges the cap, and what it clamped away is the operator's loss,
// counted in tollgate_uncharged_micro_usd_total (the store's SettledHook) and logged as a
// money warning. When its commit reply is lost and the retry finds its own settlement, it is
// the same settlement: it must say what it clamped away as the first attempt would have, or
// the counter and the log miss a loss the settled row shows (cost past charge).
func TestLostCommitReplyOfAClampedSettlementKeepsWhatTheCapClampedAway(t *testing.T) {
	f, lossy := newLossyFixture(t)
	ctx := context.Background()
	var hooked []holds.Settled
	f.store.OnSettled(func(_ holds.Settlement, res holds.Settled) { hooked = append(hooked, res) })
	h := f.admit("r_lost_clamped")
	cost := h.CapMicro + 123_456
	lossy.Arm(commitScript, testenv.LoseReply)
	res, err := f.store.Settle(ctx, holds.Settlement{RunID: "r_lost_clamped", CostMicro: cost, Source: holds.SourceComplete})
	if err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("the settlement's commit reply was never lost")
	}
	if !res.Applied || res.ChargedMicro != h.CapMicro || res.CostMicro != cost || res.UnchargedMicro != 123_456 {
		t.Errorf("clamped settlement whose commit reply was lost answered %+v; want applied, charged the cap %d of cost %d, 123456 uncharged",
			res, h.CapMicro, cost)
	}
	if len(hooked) != 1 || hooked[0].UnchargedMicro != 123_456 {
		t.Errorf("settled hook told %+v; want once, with 123456 uncharged", hooked)
	}
}

// TestLostCommitReplyOfAPruneBatchIsCounted: `gateway prune` prints how many runs it pruned. A
// batch whose COMMIT reply is lost is tried again; if it had committed, its runs are gone and
// the retry prunes the next ones. The runs of both must be counted: the count left out the
// first batch's, and the command said it pruned 2 of the 5 runs it deleted.
func TestLostCommitReplyOfAPruneBatchIsCounted(t *testing.T) {
	lossy, st, db := settledRunsToPrune(t, "prune-lost", "r_prune_lost_")
	lossy.Arm("COMMIT", testenv.LoseReply)
	res, err := st.PruneSettled(context.Background(), 8*24*time.Hour, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("the prune batch's commit reply was never lost")
	}
	checkAllPruned(t, db, res, "prune whose first batch's commit reply was lost")
}

// TestTwoLostCommitRepliesOfAPruneAreCounted: a prune batch's retry whose own COMMIT reply is
// lost again is tried a third time, which finds the second attempt's runs gone; the first
// attempt's, counted by the second, must stay counted. The count kept only the last attempt's
// and the command said it pruned 2 of the 5 runs it deleted.
func TestTwoLostCommitRepliesOfAPruneAreCounted(t *testing.T) {
	lossy, st, db := settledRunsToPrune(t, "prune-lost2", "r_prune_lost2_")
	lossy.ArmN("\x03COMMIT", testenv.LoseReply, 2) // the statement, not a session variable named after it
	res, err := st.PruneSettled(context.Background(), 8*24*time.Hour, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !lossy.Fired() {
		t.Fatal("no prune batch's commit reply was lost")
	}
	checkAllPruned(t, db, res, "prune whose two batches' commit replies were lost")
}

// settledRunsToPrune settles five runs of a new user ten days ago and returns a store on a lossy
// connection to prune them with, retrying at once: the setting of the tests of a prune batch
// whose COMMIT reply is lost.
func settledRunsToPrune(t *testing.T, user, runPrefix string) (*testenv.Lossy, *holds.Store, *sqlx.DB) {
	t.Helper()
	dsn, lossy := testenv.LossyMySQLDSN(t)
	past := holds.NewStore(openAt(t, dsn, time.Now().Add(-10*24*time.Hour)), settlePlans, "standard", zap.NewNop())
	ctx := context.Background()
	u, err := past.CreateUser(ctx, user+"-"+testenv.RandomID(3), "standard")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		run := runPrefix + strconv.Itoa(i)
		if _, err := past.Admit(ctx, holds.AdmitRequest{RunID: run, UserID: u.ID, State: holds.StateRunning, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := past.Settle(ctx, holds.Settlement{RunID: run, CostMicro: 1_000, Source: holds.SourceComplete}); err != nil {
			t.Fatal(err)
		}
	}
	db, err := holds.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	st := holds.NewStore(db, settlePlans, "standard", zap.NewNop())
	st.SetRetry(holds.RetryPolicy{MaxConflictRetries: 8, InitialBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	return lossy, st, db
}

// checkAllPruned fails the test unless the prune described by what pruned all five runs of
// settledRunsToPrune, in two batches, and counted them all.
func checkAllPruned(t *testing.T, db *sqlx.DB, res holds.PruneResult, what string) {
	t.Helper()
	var left int
	if err := db.Get(&left, "SELECT COUNT(*) FROM run_holds"); err != nil {
		t.Fatal(err)
	}
	if left != 0 || res.Runs != 5 || res.Batches != 2 {
		t.Errorf("%s: %+v, %d runs left; want 5 runs in 2 batches, none left", what, res, left)
	}
}

// admitThroughUnansweredCommit admits a new hold whose closing script commits and is then
// answered as mode says (its reply lost, or answered killed), and checks the admission claimed
// its own committed hold, one running row; it returns the run.
func admitThroughUnansweredCommit(t *testing.T, f *settleFixture, lossy *testenv.Lossy, mode testenv.LossMode, fresh bool) string {
	t.Helper()
	run := "r_unanswered_" + testenv.RandomID(4)
	lossy.Arm(commitScript, mode)
	h, err := f.store.Admit(context.Background(), holds.AdmitRequest{RunID: run, UserID: f.user.ID, State: holds.StateRunning,
		TTL: time.Minute, Fresh: fresh, Token: testenv.RandomID(16)})
	if !lossy.Fired() {
		t.Fatal("the commit was answered")
	}
	if err != nil || h.Existing || h.HeldMicro != 20_000 || h.MaxInFlight != settlePlans["standard"].MaxInFlight {
		t.Fatalf("admission whose commit went unanswered: %+v, %v; want its own new hold, under the plan's in-flight limit", h, err)
	}
	if n, state := holdRows(t, f.store, run); n != 1 || state != string(holds.StateRunning) {
		t.Fatalf("%d rows for the run, state %q", n, state)
	}
	return run
}
