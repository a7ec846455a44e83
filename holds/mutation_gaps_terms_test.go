package holds_test

import (
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
)

// TestEveryMoneyTermOfAPlanIsCompared: a command whose plans differ from the fleet's in any
// term that decides what a call is held or charged — the allowance, the run cost cap, the
// discount, either hold, the turn count that makes a call heavy — would split or show charges
// by other terms than the gateways', so each such difference, alone, is the one reported,
// under its own name, with both values.
func TestEveryMoneyTermOfAPlanIsCompared(t *testing.T) {
	base := testPlans()["standard"]
	terms := func(p holds.Plan) holds.PlanTerms {
		return holds.NewStore(nil, map[string]holds.Plan{"standard": p}, "standard", zap.NewNop()).PlanTerms()
	}
	for _, c := range []struct {
		term     string
		change   func(*holds.Plan)
		old, new string
	}{
		{"allowance_micro", func(p *holds.Plan) { p.AllowanceMicro = 3_000_000 }, "2000000", "3000000"},
		{"max_run_cost_micro", func(p *holds.Plan) { p.MaxRunCostMicro = 700_000 }, "500000", "700000"},
		{"discount_bp", func(p *holds.Plan) { p.DiscountBP = 2500 }, "0", "2500"},
		{"hold_normal_micro", func(p *holds.Plan) { p.HoldNormalMicro = 30_000 }, "20000", "30000"},
		{"hold_heavy_micro", func(p *holds.Plan) { p.HoldHeavyMicro = 90_000 }, "60000", "90000"},
		{"heavy_after_turns", func(p *holds.Plan) { p.HeavyAfterTurns = 6 }, "4", "6"},
	} {
		changed := base
		c.change(&changed)
		got := holds.DiffPlanTerms(terms(base), terms(changed))
		want := holds.PlanTermsDiff{Plan: "standard", Term: c.term, Recorded: c.old, Config: c.new}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s changed alone: diffs %+v, want [%+v]", c.term, got, want)
		}
	}
}

// TestATermMissingFromTheRecordIsADifference: terms recorded by a gateway that did not record
// one (a term added since) are not the config's, even when the config's value is zero (no
// discount): the term is reported as recorded "none", so a command cannot pass the check on a
// record that never said what the fleet charges by.
func TestATermMissingFromTheRecordIsADifference(t *testing.T) {
	config := holds.NewStore(nil, testPlans(), "standard", zap.NewNop()).PlanTerms()
	recorded := holds.PlanTerms{DefaultPlan: "standard", Plans: map[string]map[string]int64{"standard": {}}}
	for term, v := range config.Plans["standard"] {
		if term != "discount_bp" {
			recorded.Plans["standard"][term] = v
		}
	}
	want := holds.PlanTermsDiff{Plan: "standard", Term: "discount_bp", Recorded: "none", Config: "0"}
	if got := holds.DiffPlanTerms(recorded, config); len(got) != 1 || got[0] != want {
		t.Errorf("diffs %+v, want [%+v]", got, want)
	}
}

// TestAnUnreadablePlanTermsRecordIsReplaced: a serve facing a record it cannot read records its
// own terms in its place (RecordPlanTerms' contract), so that the operator's commands are
// compared with terms the fleet charges by, not refused forever by a record nothing can read.
func TestAnUnreadablePlanTermsRecordIsReplaced(t *testing.T) {
	e := newStoreEnv(t)
	if _, _, err := e.store.RecordPlanTerms(e.ctx(), "gw-1"); err != nil {
		t.Fatal(err)
	}
	// The store's own terms, and one more that no int64 holds: a decoder fills in every term
	// it can before it fails, so the terms read are the store's, and only the error tells.
	doc := map[string]any{"default_plan": "standard", "plans": map[string]any{}}
	plan := map[string]any{"future_term": "x"}
	for term, v := range e.store.PlanTerms().Plans["standard"] {
		plan[term] = v
	}
	doc["plans"].(map[string]any)["standard"] = plan
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(`UPDATE plan_terms SET terms = ? WHERE id = 1`, string(b)); err != nil {
		t.Fatal(err)
	}
	if err := e.store.CheckPlanTerms(e.ctx()); err == nil {
		t.Fatal("check of an unreadable record passed")
	}
	if _, found, err := e.store.RecordPlanTerms(e.ctx(), "gw-2"); err != nil || !found {
		t.Fatalf("record over an unreadable one: found %v, %v", found, err)
	}
	if err := e.store.CheckPlanTerms(e.ctx()); err != nil {
		t.Errorf("check after the unreadable record was replaced: %v", err)
	}
}

// TestASettlementInTheAdmissionsBatchFreesWhatItsRunCounted: a named run whose calls spent
// past its hold counts its spending against the balance, discounted and rounded up to the
// micro-USD as its settlement charges it (90 000.75 is 90 001). Settled in the same batch as
// an admission, the run leaves the aggregate what it counted there, to the micro: the next
// call then holds exactly what is left after the charge, not a micro-USD less.
func TestASettlementInTheAdmissionsBatchFreesWhatItsRunCounted(t *testing.T) {
	f := newAcctFixture(t)
	u, charge := namedRunSpentPastItsHold(t, f, "batched", "x_batched")
	const allowance, cost = roundingRunAllowance, roundingRunCost
	if charge != 90_001 {
		t.Fatalf("ApplyDiscount(%d, %d) = %d, want 90 001", cost, roundingRunDiscount, charge)
	}
	next := holds.AdmitRequest{RunID: "r_batched_next", UserID: u.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute}
	settled, admitted, err := f.store.WriteBatch(f.ctx(),
		[]holds.Settlement{{RunID: "x_batched", CostMicro: cost, Calls: 1, Source: holds.SourceClient}}, []holds.AdmitRequest{next})
	if err != nil || settled[0].Err != nil || admitted[0].Err != nil {
		t.Fatalf("batch: %v, %+v, %+v", err, settled, admitted)
	}
	if settled[0].ChargedMicro != charge {
		t.Fatalf("run charged %d, want %d", settled[0].ChargedMicro, charge)
	}
	if left := allowance - charge; admitted[0].Hold.HeldMicro != left || admitted[0].Hold.CapMicro != left {
		t.Fatalf("next call held %d, cap %d: want both the %d left", admitted[0].Hold.HeldMicro, admitted[0].Hold.CapMicro, left)
	}
	f.settle("r_batched_next", 0)
}

// TestRecordingTheSameCreditUnitLeavesWhoSetItAlone: a gateway restarted at the fleet's
// credit_micro changes nothing; the record keeps naming the gateway that set the value, and
// when, which is what a refused command's error points the operator to.
func TestRecordingTheSameCreditUnitLeavesWhoSetItAlone(t *testing.T) {
	e := newStoreEnv(t)
	if _, _, err := e.store.RecordCreditUnit(e.ctx(), 1000, "gw-1", false); err != nil {
		t.Fatal(err)
	}
	first, err := e.store.CreditUnit(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if prev, found, err := e.store.RecordCreditUnit(e.ctx(), 1000, "gw-2", false); err != nil || !found || prev.SetBy != "gw-1" {
		t.Fatalf("second record of the same value: %+v, found %v, %v", prev, found, err)
	}
	if u, err := e.store.CreditUnit(e.ctx()); err != nil || u.SetBy != "gw-1" || !u.SetAt.Equal(first.SetAt) {
		t.Errorf("after the same value again: %+v, %v; want gw-1's record of %v unchanged", u, err, first.SetAt)
	}
}
