package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// refusedMarks is the reconciler's RefusalSource over the test's tally, or failing with err.
type refusedMarks struct {
	e   *storeEnv
	err error
}

func (r refusedMarks) Refused(ctx context.Context, runID, token string) (bool, error) {
	if r.err != nil {
		return false, r.err
	}
	return r.e.tally.Refused(ctx, runID, token)
}

// TestReconcileReleasesARefusedAdmissionsHold: a request whose admission's COMMIT reply was
// lost is refused 503 and marks its admission (run, token) refused; its process dies before
// its release lands. The hold carrying that token, found with no lease and no tally, is
// released at 0 (admit_lost), where without the mark an Idempotency-Key attempt's hold (which
// gets no zero tally) was charged what it held. The mark of another token on the same run — a
// refused request whose admission never committed, the run then taken by a retry that did
// forward — leaves that hold to DESIGN §5 (its hold charged); so does a named run's (its
// other calls forward on its hold); a tally settles from the tally whatever the marks say; and
// a mark that cannot be read leaves the hold for the next pass rather than charging it.
func TestReconcileReleasesARefusedAdmissionsHold(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("refused", 20, nil)
	admit := func(runID, token, clientRunID string) holds.Hold {
		t.Helper()
		h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Hour, Token: token, ClientRunID: clientRunID})
		if err != nil {
			t.Fatal(err)
		}
		e.expire(runID)
		return h
	}
	mark := func(runID, token string) {
		t.Helper()
		if err := e.tally.MarkRefused(e.ctx(), runID, token); err != nil {
			t.Fatal(err)
		}
	}
	const tokA, tokB, tokC, tokD = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
		"cccccccccccccccccccccccccccccccc", "dddddddddddddddddddddddddddddddd"
	refused := admit("r_refused_attempt", tokA, "")
	mark(refused.RunID, tokA)
	retried := admit("r_retried_attempt", tokB, "")
	mark(retried.RunID, tokC) // a refused request's, whose admission never committed
	named := admit("r_named_refused", tokD, "agent-run")
	mark(named.RunID, tokD)
	talliedRun := admit("r_refused_tallied", tokC, "")
	mark(talliedRun.RunID, tokC)
	e.addTally(talliedRun.RunID, pricing.Usage{Input: 10, Output: 2}, 900)

	// Unreadable marks: nothing is charged, the pass fails, the holds wait.
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Refusals = refusedMarks{err: errors.New("redis down")} })
	if _, err := e.pass(rec); err == nil {
		t.Error("a pass that could not read a refusal mark reported no error")
	}
	if r := e.run(u, refused.RunID); r.State != holds.StateRunning {
		t.Fatalf("refused attempt's hold settled (%s, charged %d) though its mark was unreadable", r.SettleSource.String, r.ChargedMicro)
	}

	rec = e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Refusals = refusedMarks{e: e} })
	for range 4 { // the failing pass above may have left a cursor; a few passes drain it all
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what, runID, source string
		charged             int64
	}{
		{"refused attempt (its own token marked)", refused.RunID, holds.SourceAdmitLost, 0},
		{"attempt run by a retry (another token marked)", retried.RunID, holds.SourceReconcileHold, retried.HeldMicro},
		{"named run (marks not read)", named.RunID, holds.SourceReconcileHold, named.HeldMicro},
		{"tallied run", talliedRun.RunID, holds.SourceReconcile, 900},
	} {
		r := e.run(u, c.runID)
		if r.State != holds.StateSettled || r.SettleSource.String != c.source || r.ChargedMicro != c.charged {
			t.Errorf("%s: %s by %q charged %d, want settled by %s charged %d", c.what, r.State, r.SettleSource.String,
				r.ChargedMicro, c.source, c.charged)
		}
	}
}

// TestReconcileAsksNoMarkOfAHoldItSettlesAnyway: a refusal mark decides only a running hold
// with no tally that carries its admission's token. The reconciler asks of nothing else, so
// with the marks unreadable (Redis failing that read) a tallied hold is still settled from its
// tally, a queued hold still released, and a running hold inserted without a token still
// charged what it held, each in that pass: asked, each failed on the unreadable mark and
// waited for a pass that could read it, for a mark that could not change its settlement.
func TestReconcileAsksNoMarkOfAHoldItSettlesAnyway(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("refused-unasked", 20, nil)
	admit := func(runID, token string, state holds.State) holds.Hold {
		t.Helper()
		h, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
			State: state, TTL: time.Hour, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		e.expire(runID)
		return h
	}
	const tokA, tokB = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	talliedRun := admit("r_unasked_tallied", tokA, holds.StateRunning)
	e.addTally(talliedRun.RunID, pricing.Usage{Input: 10, Output: 2}, 900)
	queued := admit("r_unasked_queued", tokB, holds.StateQueued)
	tokenless := admit("r_unasked_tokenless", "", holds.StateRunning)

	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Refusals = refusedMarks{err: errors.New("redis down")} })
	if _, err := e.pass(rec); err != nil {
		t.Fatalf("a pass with no hold a mark could decide failed on the unreadable marks: %v", err)
	}
	for _, c := range []struct {
		what, runID, source string
		charged             int64
	}{
		{"tallied run", talliedRun.RunID, holds.SourceReconcile, 900},
		{"queued hold", queued.RunID, holds.SourceRelease, 0},
		{"hold without a token", tokenless.RunID, holds.SourceReconcileHold, tokenless.HeldMicro},
	} {
		r := e.run(u, c.runID)
		if r.State != holds.StateSettled || r.SettleSource.String != c.source || r.ChargedMicro != c.charged {
			t.Errorf("%s: %s by %q charged %d, want settled by %s charged %d", c.what, r.State, r.SettleSource.String,
				r.ChargedMicro, c.source, c.charged)
		}
	}
}

// replacedWhenAsked is the reconciler's RefusalSource over the test's tally that, asked about
// the admission of run with token old, first puts another admission's hold in its place: the
// row the scan read is deleted, and req (the same run id, another token) admitted and expired.
type replacedWhenAsked struct {
	e        *storeEnv
	run, old string
	req      holds.AdmitRequest
	err      chan error
}

func (r replacedWhenAsked) Refused(ctx context.Context, runID, token string) (bool, error) {
	if runID == r.run && token == r.old {
		r.err <- r.replace(ctx)
	}
	return r.e.tally.Refused(ctx, runID, token)
}

func (r replacedWhenAsked) replace(ctx context.Context) error {
	if _, err := r.e.db.ExecContext(ctx, "DELETE FROM run_holds WHERE run_id = ?", r.run); err != nil {
		return err
	}
	if _, err := r.e.store.Admit(ctx, r.req); err != nil {
		return err
	}
	_, err := r.e.db.ExecContext(ctx, "UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?", r.run)
	return err
}

// TestReconcilerDoesNotReleaseAnotherAdmissionsHoldOnARefusedRun: the reconciler's release
// at 0 of a hold whose admission was marked refused (admit_lost) closes only the hold carrying
// the token it found marked (Settlement.AdmitToken), not whatever hold has the run id by the
// time the settlement locks the row. No code path gives a live row another token, but a row
// replaced between the scan and the lock — deleted by hand, or pruned and its Idempotency-Key
// run id admitted again — carries another request's hold, expired and unleased too: that
// request forwarded, and released under the refused one's mark its call was free. It is left
// to its own reconciliation, which charges it what it held (no mark of its token, no tally).
func TestReconcilerDoesNotReleaseAnotherAdmissionsHoldOnARefusedRun(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("refused-replaced", 20, nil)
	const refusedTok, forwardedTok = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	req := holds.AdmitRequest{RunID: "r_refused_replaced", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning,
		TTL: time.Hour, Token: refusedTok}
	if _, err := e.store.Admit(e.ctx(), req); err != nil {
		t.Fatal(err)
	}
	e.expire(req.RunID)
	if err := e.tally.MarkRefused(e.ctx(), req.RunID, refusedTok); err != nil {
		t.Fatal(err)
	}
	forwarded := req
	forwarded.Token = forwardedTok
	marks := replacedWhenAsked{e: e, run: req.RunID, old: refusedTok, req: forwarded, err: make(chan error, 1)}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.Refusals = marks })
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-marks.err; err != nil {
		t.Fatalf("the run's hold replaced by another admission's: %v", err)
	}
	if r := e.run(u, req.RunID); r.State != holds.StateRunning {
		t.Fatalf("pass %+v: the hold of the admission that replaced the refused one is %s by %q, charged %d: want it left running",
			st, r.State, r.SettleSource.String, r.ChargedMicro)
	}
	// Its user is there: the pass does not count it a hold of a user that no longer exists,
	// which fails `gateway reconcile -once` with "restore the users".
	if st.Orphans != 0 {
		t.Errorf("pass %+v: the replaced hold counted among the holds of users that no longer exist", st)
	}
	// The next pass reconciles it as the hold it is: forwarded, its usage lost.
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	r := e.run(u, req.RunID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != r.HeldMicro ||
		r.ChargedMicro == 0 {
		t.Errorf("the replacing hold: %s by %q charged %d of %d held, want settled by %s charged what it held", r.State,
			r.SettleSource.String, r.ChargedMicro, r.HeldMicro, holds.SourceReconcileHold)
	}
}
