package holds_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestReconcileRefundsAHoldChargedBeforeItsCallsTally: a one-call run found expired with no
// lease and no tally is charged what it held (reconcile_hold): its process looked dead. When
// the process was only stopped (SIGSTOP, a VM's live migration) its call comes back, ends and
// writes its tally; its own settlement finds the run settled and the process refunds the
// difference by a grant keyed pause-refund:{run_id} — unless it is killed before that grant,
// when the scan, which never reads a settled run again, left the whole hold charged. A later
// pass reads the tally the charge did not see and grants what the call did not use, by the same
// key and the same arithmetic (its discount, its cap), once.
//
// It refunds nothing where the charge is right or not its to judge: a call that truly died
// (no tally, ever: what reconcile_hold is for), one whose tally says it used the hold or more,
// one a live process still serves (its lease: that process refunds at its own figures), a named
// run (its hold is many calls'), a tally of more than one call, a run its process refunded
// already, and a run charged longer ago than the tally lives.
func TestReconcileRefundsAHoldChargedBeforeItsCallsTally(t *testing.T) {
	e := newStoreEnvMidday(t)
	quarter := 2_500
	u := e.user("pause-refund-rec", 50, nil)
	ud := e.user("pause-refund-rec-discount", 50, &quarter)
	type tc struct {
		what, runID, clientRunID string
		user                     holds.User
		// after writes what the call's process wrote after the charge.
		after func(runID string)
		// refund is the grant wanted of the held charge c; -1: none.
		refund func(c int64) int64
	}
	record := func(cost int64) func(string) {
		return func(runID string) {
			if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, cost, false, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	none := func(int64) int64 { return -1 }
	var processRefund int64 = 1234
	cases := []tc{
		{what: "came back, used 900", runID: "r_pr_used", user: u, after: record(900), refund: func(c int64) int64 { return c - 900 }},
		{what: "came back at a discount, used 900", runID: "r_pr_discount", user: ud, after: record(900),
			refund: func(c int64) int64 { return c - 675 }},
		{what: "came back, never forwarded", runID: "r_pr_unused", user: u, after: func(runID string) {
			if err := e.tally.MarkUnused(e.ctx(), runID); err != nil {
				t.Fatal(err)
			}
		}, refund: func(c int64) int64 { return c }},
		{what: "truly dead", runID: "r_pr_dead", user: u, after: func(string) {}, refund: none},
		{what: "used more than its hold", runID: "r_pr_more", user: u, after: record(10_000_000), refund: none},
		{what: "still served by a live process", runID: "r_pr_leased", user: u, after: func(runID string) {
			record(900)(runID)
			if err := e.rdb.Set(e.ctx(), e.keys.Lease(runID), "other", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}, refund: none},
		{what: "named run", runID: "r_pr_named", clientRunID: "agent-pr", user: u, after: func(runID string) {
			e.addTally(runID, pricing.Usage{Input: 100, Output: 20}, 900)
		}, refund: none},
		{what: "a tally of two calls", runID: "r_pr_two", user: u, after: func(runID string) {
			e.addTally(runID, pricing.Usage{Input: 100, Output: 20}, 400)
			e.addTally(runID, pricing.Usage{Input: 100, Output: 20}, 500)
		}, refund: none},
		{what: "refunded by its process", runID: "r_pr_process", user: u, after: func(runID string) {
			record(900)(runID)
			if _, _, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: processRefund,
				IdempotencyKey: holds.PauseRefundKey(runID), Reason: "refund: the process's own"}); err != nil {
				t.Fatal(err)
			}
		}, refund: func(int64) int64 { return processRefund }},
		{what: "charged before the tally's life", runID: "r_pr_old", user: u, after: func(runID string) {
			record(900)(runID)
			if _, err := e.db.ExecContext(e.ctx(), "UPDATE run_holds SET settled_at = settled_at - INTERVAL 2 HOUR WHERE run_id = ?", runID); err != nil {
				t.Fatal(err)
			}
		}, refund: none},
	}
	for _, c := range cases {
		if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: c.runID, UserID: c.user.ID, ClientRunID: c.clientRunID,
			Model: "fake-gpt", State: holds.StateRunning, TTL: time.Hour}); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		e.expire(c.runID)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	charged := map[string]int64{}
	for _, c := range cases {
		r := e.run(c.user, c.runID)
		if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 900 {
			t.Fatalf("%s: %s by %q charged %d; the scene is a hold charged what it held, above the call's 900", c.what, r.State,
				r.SettleSource.String, r.ChargedMicro)
		}
		charged[c.runID] = r.ChargedMicro
		c.after(c.runID)
	}
	// Two passes: the second must find nothing more to give back.
	for range 2 {
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		var grants []int64
		if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(c.runID)); err != nil {
			t.Fatal(err)
		}
		want := c.refund(charged[c.runID])
		switch {
		case want < 0 && len(grants) != 0:
			t.Errorf("%s: granted %v µUSD back of a %d charge; want none", c.what, grants, charged[c.runID])
		case want >= 0 && (len(grants) != 1 || grants[0] != want):
			t.Errorf("%s: granted %v µUSD back of a %d charge; want one grant of %d", c.what, grants, charged[c.runID], want)
		}
		if r := e.run(c.user, c.runID); r.ChargedMicro != charged[c.runID] {
			t.Errorf("%s: the run's charge moved from %d to %d; a refund is a grant, the settlement stands", c.what, charged[c.runID], r.ChargedMicro)
		}
	}

	// The lease gone (its process ended without refunding), the next pass refunds it; the
	// process's own refund, of the same figures, coming after, is that grant again.
	leased := "r_pr_leased"
	if err := e.rdb.Del(e.ctx(), e.keys.Lease(leased)).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := charged[leased] - 900
	if st.PauseRefunds != 1 {
		t.Errorf("pass after the lease lapsed refunded %d runs; want 1", st.PauseRefunds)
	}
	again, created, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: want,
		IdempotencyKey: holds.PauseRefundKey(leased), Reason: "refund: the process's own, late"})
	if err != nil || created || again.AmountMicro != want {
		t.Errorf("the process's refund after the pass's: %+v created %v, %v; want the pass's grant of %d replayed", again, created, err, want)
	}
	if _, _, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: want + 1,
		IdempotencyKey: holds.PauseRefundKey(leased), Reason: "refund: other figures"}); !errors.Is(err, holds.ErrGrantKeyReused) {
		t.Errorf("a refund of other figures under the same key: %v; want ErrGrantKeyReused", err)
	}
	var n int
	if err := e.db.GetContext(e.ctx(), &n, "SELECT COUNT(*) FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(leased)); err != nil || n != 1 {
		t.Errorf("%d grants keyed for the run (%v); want 1", n, err)
	}
}

// TestReconcileRefundsARefusedAdmissionsHoldChargedDuringAPause: an admission refused after its
// hold's COMMIT (its reply lost, or a hold too small for its prompt) marks its run and token
// refused, then releases the hold at 0. A process stopped between that COMMIT and the mark past
// the hold's life had the hold charged what it held (reconcile_hold: no lease, no tally, no mark
// yet); resumed, it marks, its release finds the run settled, and it refunds the whole charge
// by the grant keyed pause-refund:{run_id} — unless it is killed before that grant. Such a hold
// has no tally (an Idempotency-Key attempt's and a too-small hold's get none), only the mark:
// a pass reads it as the scan would have, had it been there, and gives the whole charge back
// under the same key, once; the process's own refund coming after is that grant again.
//
// The mark of another token on the run (a refused request whose admission never committed, the
// run then taken by another request) is no word on this hold, and a lease is a live process's:
// neither is refunded.
func TestReconcileRefundsARefusedAdmissionsHoldChargedDuringAPause(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("pause-refund-refused", 50, nil)
	const tok, other = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	mark := func(token string) func(string) {
		return func(runID string) {
			if err := e.tally.MarkRefused(e.ctx(), runID, token); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		what, runID string
		after       func(runID string) // what the refused admission's process wrote after the charge
		refunded    bool               // the whole charge given back
	}{
		{what: "refused, marked after the charge", runID: "r_prr_marked", after: mark(tok), refunded: true},
		{what: "another request's token marked", runID: "r_prr_other", after: mark(other)},
		{what: "marked, and leased", runID: "r_prr_leased", after: func(runID string) {
			mark(tok)(runID)
			if err := e.rdb.Set(e.ctx(), e.keys.Lease(runID), "other", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: c.runID, UserID: u.ID, Model: "fake-gpt",
			State: holds.StateRunning, TTL: time.Hour, Token: tok}); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		e.expire(c.runID)
	}
	// RefundAfter as cmd wires it (a lease TTL): it waits on a tally that may yet be set right,
	// not on a mark, which no process writes again (a hold with no tally has no age).
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		c.RefundWindow, c.Refusals, c.RefundAfter = time.Hour, refusedMarks{e: e}, 30*time.Second
	})
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	charged := map[string]int64{}
	for _, c := range cases {
		r := e.run(u, c.runID)
		if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
			t.Fatalf("%s: %s by %q charged %d; the scene is a hold charged what it held", c.what, r.State, r.SettleSource.String, r.ChargedMicro)
		}
		charged[c.runID] = r.ChargedMicro
		c.after(c.runID)
	}
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.PauseRefunds != 1 {
		t.Errorf("pass refunded %d runs; want 1", st.PauseRefunds)
	}
	if st, err = e.pass(rec); err != nil || st.PauseRefunds != 0 {
		t.Errorf("second pass refunded %d runs (%v); want none more", st.PauseRefunds, err)
	}
	for _, c := range cases {
		var grants []int64
		if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(c.runID)); err != nil {
			t.Fatal(err)
		}
		switch {
		case !c.refunded && len(grants) != 0:
			t.Errorf("%s: granted %v µUSD back of a %d charge; want none", c.what, grants, charged[c.runID])
		case c.refunded && (len(grants) != 1 || grants[0] != charged[c.runID]):
			t.Errorf("%s: granted %v µUSD back of a %d charge; want one grant of it all", c.what, grants, charged[c.runID])
		}
		if r := e.run(u, c.runID); r.ChargedMicro != charged[c.runID] {
			t.Errorf("%s: the run's charge moved from %d to %d; a refund is a grant, the settlement stands", c.what, charged[c.runID], r.ChargedMicro)
		}
	}
	// The grant says why (an operator reading the ledger): a refusal, not a tally, since the
	// hold has none.
	var reason string
	if err := e.db.GetContext(e.ctx(), &reason, "SELECT reason FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey("r_prr_marked")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "refusal") {
		t.Errorf("the refused admission's refund is granted for %q; want its refusal named", reason)
	}
	// An Idempotency-Key retry reads that refund (PauseRefunded) once Redis lost the key's
	// record: a hold refused before anything was forwarded on it answered nothing, and its key
	// may run again; taken for one that answered, the retry is refused 409.
	if amount, answeredNothing, err := e.store.PauseRefunded(e.ctx(), u.ID, "r_prr_marked"); err != nil ||
		amount != charged["r_prr_marked"] || !answeredNothing {
		t.Errorf("PauseRefunded of the refused admission's hold: %d, answered nothing %v (%v); want %d, answered nothing",
			amount, answeredNothing, err, charged["r_prr_marked"])
	}

	// The process's own refund, resumed late (holds.PauseRefund of a call that cost nothing),
	// is the pass's grant again.
	marked := e.run(u, "r_prr_marked")
	want, _ := holds.PauseRefund(marked, 0, false)
	g, created, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: want,
		IdempotencyKey: holds.PauseRefundKey(marked.RunID), Reason: "refund: the process's own, late"})
	if err != nil || created || g.AmountMicro != charged[marked.RunID] {
		t.Errorf("the process's refund after the pass's: %+v created %v, %v; want the pass's grant of %d replayed", g, created, err, charged[marked.RunID])
	}
}

// TestReconcileRevisitWaitsForATallyToStandStill: a one-call run charged its hold whose call's
// process, resumed from a pause, writes the call's tally at its final event and sets it right
// beside its settlement (usage reported after that event) — with no lease yet: its heartbeat has
// not written it again. A pass that read the first figures as final refunded on them, and the
// process's own refund of the right ones was then refused (ErrGrantKeyReused): the user was
// over-refunded. The revisit leaves a tally younger than RefundAfter for a later pass; once the
// tally has stood that long (its write time set back here) it refunds on the call's
// whole figures, and the process's refund of them is that grant again.
func TestReconcileRevisitWaitsForATallyToStandStill(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("pause-refund-young", 50, nil)
	const (
		runID  = "r_pr_young"
		settle = 30 * time.Second
	)
	e.admit(u, runID, holds.StateRunning)
	e.expire(runID)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour; c.RefundAfter = settle })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	charged := e.run(u, runID).ChargedMicro
	if r := e.run(u, runID); r.SettleSource.String != holds.SourceReconcileHold || charged <= 900 {
		t.Fatalf("%s by %q charged %d; the scene is a hold charged what it held, above the call's 900", r.State, r.SettleSource.String, charged)
	}
	write := func(seq, cost int64) {
		t.Helper()
		if err := e.tally.RecordCallWith(e.ctx(), runID, seq, pricing.Usage{Input: 100, Output: cost / 10}, cost, false, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	granted := func() []int64 {
		t.Helper()
		var grants []int64
		if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(runID)); err != nil {
			t.Fatal(err)
		}
		return grants
	}
	// The final event's figures, then the call's whole ones: each a tally just written.
	for i, cost := range []int64{300, 900} {
		write(int64(i+1), cost)
		st, err := e.pass(rec)
		if err != nil {
			t.Fatal(err)
		}
		if g := granted(); st.PauseRefunds != 0 || len(g) != 0 {
			t.Fatalf("pass on a tally of %d written just now: refunded %d runs, grants %v of a %d charge; want none until it stands still for %v",
				cost, st.PauseRefunds, g, charged, settle)
		}
	}
	// Its process killed before its refund: the tally stands still past RefundAfter.
	e.ageTally(runID, settle+time.Second)
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := charged - 900
	if g := granted(); st.PauseRefunds != 1 || len(g) != 1 || g[0] != want {
		t.Fatalf("pass on a tally older than %v: refunded %d runs, grants %v; want one grant of %d (%d charged, 900 used)",
			settle, st.PauseRefunds, g, want, charged)
	}
	again, created, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: want,
		IdempotencyKey: holds.PauseRefundKey(runID), Reason: "refund: the process's own, late"})
	if err != nil || created || again.AmountMicro != want {
		t.Errorf("the process's refund after the pass's: %+v created %v, %v; want the pass's grant of %d replayed", again, created, err, want)
	}
}

// beatBeforeRead is the tally of a run whose process, resumed from a pause, beats its lease
// again just as a pass reads the tally: the pass must see that lease.
type beatBeforeRead struct {
	tallyUsage
	e *storeEnv
}

func (b beatBeforeRead) Tallied(ctx context.Context, runID string) (holds.RunTally, bool, error) {
	if err := b.e.rdb.Set(ctx, b.e.keys.Lease(runID), "resumed", time.Minute).Err(); err != nil {
		return holds.RunTally{}, false, err
	}
	return b.tallyUsage.Tallied(ctx, runID)
}

// TestReconcileRevisitAsksTheLeaseAfterTheTally: a tally that has stood RefundAfter may still
// be a live process's, its correction to come: the process was stopped again right after its
// final event's write. Resumed, it beats its lease before it writes again; the revisit asks the
// lease after it reads the tally, so a beat that lands by the tally's read is seen and the
// tally left to its process. Asked before, the lease was not there yet, and the pass refunded
// on the final event's figures (300 of the call's 900: over-refunded).
func TestReconcileRevisitAsksTheLeaseAfterTheTally(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("pause-refund-beat", 50, nil)
	const (
		runID  = "r_pr_beat"
		settle = 30 * time.Second
	)
	e.admit(u, runID, holds.StateRunning)
	e.expire(runID)
	config := func(c *holds.ReconcilerConfig) { c.RefundWindow, c.RefundAfter = time.Hour, settle }
	if _, err := e.pass(e.reconciler("me", config)); err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 300 {
		t.Fatalf("%s by %q charged %d; the scene is a hold charged what it held, above the final event's 300", r.State, r.SettleSource.String, r.ChargedMicro)
	}
	if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 30}, 300, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	e.ageTally(runID, settle+time.Second)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) {
		config(c)
		c.Usage = beatBeforeRead{tallyUsage: tallyUsage{e.tally}, e: e}
	})
	st, err := e.pass(rec)
	if err != nil {
		t.Fatal(err)
	}
	var grants []int64
	if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(runID)); err != nil {
		t.Fatal(err)
	}
	if st.PauseRefunds != 0 || len(grants) != 0 {
		t.Errorf("pass whose process beat its lease as the tally was read: refunded %d runs, grants %v; want none: the process refunds", st.PauseRefunds, grants)
	}
}

// TestReconcileRevisitWithoutRefusalsAsksNone: ReconcilerConfig.Refusals nil is a reconciler
// that never asks a mark (a test's, a tool's): its revisit of a hold charged with no tally
// leaves it, marked or not, as it leaves one whose call truly died. Asked, the pass panicked.
func TestReconcileRevisitWithoutRefusalsAsksNone(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("pause-refund-no-refusals", 50, nil)
	const runID, tok = "r_prr_unasked", "cccccccccccccccccccccccccccccccc"
	if _, err := e.store.Admit(e.ctx(), holds.AdmitRequest{RunID: runID, UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Hour, Token: tok}); err != nil {
		t.Fatal(err)
	}
	e.expire(runID)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	if r := e.run(u, runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 0 {
		t.Fatalf("%s by %q charged %d; the scene is a hold charged what it held", r.State, r.SettleSource.String, r.ChargedMicro)
	}
	if err := e.tally.MarkRefused(e.ctx(), runID, tok); err != nil {
		t.Fatal(err)
	}
	if st, err := e.pass(rec); err != nil || st.PauseRefunds != 0 {
		t.Errorf("pass without Refusals: refunded %d runs (%v); want none", st.PauseRefunds, err)
	}
}

// TestReconcileRevisitSaysWhatItsTallySaysTheCallAnswered: the revisit's refund of a call's
// zero tally gives its reason as the call's own process would have (PauseRefunded reads it):
// a call its upstream refused or one never forwarded answered nothing, by the settlement source
// its tally keeps (MarkCallUnused). Under the one generic reason, an Idempotency-Key attempt
// refused by its upstream whose process was killed before its own refund was taken for one that
// answered, once Redis lost the key's record, and its retry refused. A zero tally that names no
// source (a free call's, an older gateway's) and one with figures say nothing of the kind.
func TestReconcileRevisitSaysWhatItsTallySaysTheCallAnswered(t *testing.T) {
	e := newStoreEnv(t)
	u := e.user("pause-refund-source", 50, nil)
	unused := func(source string) func(string) error {
		return func(runID string) error { return e.tally.MarkCallUnused(e.ctx(), runID, source) }
	}
	cases := []struct {
		what, runID     string
		after           func(runID string) error
		answeredNothing bool
	}{
		{"refused by its upstream", "r_src_upstream", unused(holds.SourceUpstreamError), true},
		{"never forwarded", "r_src_release", unused(holds.SourceRelease), true},
		{"a duplicate", "r_src_duplicate", unused(holds.SourceDuplicate), true},
		{"a zero tally naming no source", "r_src_none", unused(""), false},
		{"answered at no cost", "r_src_complete", unused(holds.SourceComplete), false},
		{"figures beside the source", "r_src_figures", func(runID string) error {
			if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, 900, false, nil, nil); err != nil {
				return err
			}
			return unused(holds.SourceUpstreamError)(runID)
		}, false},
		{"answered at no cost, tokens beside an upstream_error source", "r_src_free", func(runID string) error {
			if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, 0, false, nil, nil); err != nil {
				return err
			}
			return unused(holds.SourceUpstreamError)(runID)
		}, false},
		{"a lost admission's release", "r_src_admit_lost", unused(holds.SourceAdmitLost), true},
	}
	for _, c := range cases {
		e.admit(u, c.runID, holds.StateRunning)
		e.expire(c.runID)
	}
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if r := e.run(u, c.runID); r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro <= 900 {
			t.Fatalf("%s: %s by %q charged %d; the scene is a hold charged what it held", c.what, r.State, r.SettleSource.String, r.ChargedMicro)
		}
		if err := c.after(c.runID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		amount, answeredNothing, err := e.store.PauseRefunded(e.ctx(), u.ID, c.runID)
		if err != nil || amount <= 0 || answeredNothing != c.answeredNothing {
			t.Errorf("%s: refunded %d, answered nothing %v (%v); want a refund saying answered nothing %v",
				c.what, amount, answeredNothing, err, c.answeredNothing)
		}
	}
}

// TestReconcileRevisitTakesNothingMoreOfACallThatUsedMoreThanItsCharge: a one-call run charged
// its hold (reconcile_hold) whose tally, written after, says the call used more than that
// charge, though less than its cap. Its charge stands and nothing is given back; nor is the
// difference taken: a refund below zero is no refund, and a user with prepaid credits enough to
// pay it is not debited by the pass (a grant of a negative amount would take it).
func TestReconcileRevisitTakesNothingMoreOfACallThatUsedMoreThanItsCharge(t *testing.T) {
	e := newStoreEnvMidday(t)
	u := e.user("pause-refund-used-more", 50, nil)
	if _, _, err := e.store.Grant(e.ctx(), holds.GrantRequest{UserID: u.ID, AmountMicro: 1_000_000,
		IdempotencyKey: "topup-used-more", Reason: "topup"}); err != nil {
		t.Fatal(err)
	}
	const runID = "r_pr_used_more"
	h := e.admit(u, runID, holds.StateRunning)
	e.expire(runID)
	rec := e.reconciler("me", func(c *holds.ReconcilerConfig) { c.RefundWindow = time.Hour })
	if _, err := e.pass(rec); err != nil {
		t.Fatal(err)
	}
	r := e.run(u, runID)
	used := r.ChargedMicro + 10_000
	if r.SettleSource.String != holds.SourceReconcileHold || r.ChargedMicro != h.HeldMicro || used >= h.CapMicro {
		t.Fatalf("run %s by %q charged %d of a hold of %d, cap %d; the scene is a hold charged what it held, below its cap by more than 10000",
			r.State, r.SettleSource.String, r.ChargedMicro, h.HeldMicro, h.CapMicro)
	}
	if err := e.tally.RecordCallWith(e.ctx(), runID, 1, pricing.Usage{Input: 100, Output: 20}, used, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	before := e.run(u, runID)
	b0, err := e.store.Balance(e.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.pass(rec); err != nil {
			t.Fatal(err)
		}
	}
	var grants []int64
	if err := e.db.SelectContext(e.ctx(), &grants, "SELECT amount_micro FROM grants WHERE idempotency_key = ?", holds.PauseRefundKey(runID)); err != nil {
		t.Fatal(err)
	}
	if len(grants) != 0 {
		t.Errorf("granted %v µUSD for a call that used %d of a %d charge; want no grant: the charge stands", grants, used, before.ChargedMicro)
	}
	b1, err := e.store.Balance(e.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b1.PrepaidMicro != b0.PrepaidMicro {
		t.Errorf("prepaid moved from %d to %d on the revisit; want it unchanged: nothing more is taken", b0.PrepaidMicro, b1.PrepaidMicro)
	}
	if r := e.run(u, runID); r.ChargedMicro != before.ChargedMicro {
		t.Errorf("the run's charge moved from %d to %d; want it standing", before.ChargedMicro, r.ChargedMicro)
	}
}
