package holds_test

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestPlanTermsRecordedAreWhatCommandsCompare: the first serve records its plan terms; a store
// of the same plans passes the check, one whose allowance differs, or that has another plan,
// is refused naming the first difference; a serve with other plans records them in place of
// the old (plans change routinely, by a serve with the new config), returning the old, and the
// check then follows it. A serve of the same terms leaves the row, and who set it, alone.
func TestPlanTermsRecordedAreWhatCommandsCompare(t *testing.T) {
	e := newStoreEnv(t)
	if err := e.store.CheckPlanTerms(e.ctx()); !errors.Is(err, holds.ErrNoPlanTerms) {
		t.Fatalf("check with nothing recorded: %v, want ErrNoPlanTerms", err)
	}
	if _, found, err := e.store.RecordPlanTerms(e.ctx(), "gw-1"); err != nil || found {
		t.Fatalf("first record: found %v, %v; want recorded with nothing before", found, err)
	}
	if err := e.store.CheckPlanTerms(e.ctx()); err != nil {
		t.Fatalf("check of the recorded terms: %v", err)
	}

	raised := testPlans()
	p := raised["standard"]
	p.AllowanceMicro += 1000
	raised["standard"] = p
	withPro := testPlans()
	withPro["pro"] = withPro["standard"]
	onlyInFlight := testPlans()
	p = onlyInFlight["standard"]
	p.MaxInFlight++
	onlyInFlight["standard"] = p
	if err := holds.NewStore(e.db, onlyInFlight, "standard", e.log).CheckPlanTerms(e.ctx()); err != nil {
		t.Errorf("plans that differ in max_in_flight alone (no money term): %v, want them passed", err)
	}
	for _, c := range []struct {
		plans       map[string]holds.Plan
		defaultPlan string
		want        holds.PlanTermsDiff
	}{
		{raised, "standard", holds.PlanTermsDiff{Plan: "standard", Term: "allowance_micro", Recorded: "2000000", Config: "2001000"}},
		{withPro, "standard", holds.PlanTermsDiff{Plan: "pro", Config: "configured"}},
		{withPro, "pro", holds.PlanTermsDiff{Term: "default_plan", Recorded: "standard", Config: "pro"}}, // first
	} {
		err := holds.NewStore(e.db, c.plans, c.defaultPlan, e.log).CheckPlanTerms(e.ctx())
		var mismatch *holds.PlanTermsMismatchError
		if !errors.As(err, &mismatch) || mismatch.First != c.want || mismatch.Recorded.SetBy != "gw-1" {
			t.Errorf("check of %v: %v, want a mismatch %+v recorded by gw-1", c.plans, err, c.want)
		}
	}

	newer := holds.NewStore(e.db, raised, "standard", e.log)
	prev, found, err := newer.RecordPlanTerms(e.ctx(), "gw-2")
	if err != nil || !found || prev.SetBy != "gw-1" || prev.Terms.Plans["standard"]["allowance_micro"] != 2_000_000 {
		t.Fatalf("record of raised terms: %+v, found %v, %v; want gw-1's terms before", prev, found, err)
	}
	if err := newer.CheckPlanTerms(e.ctx()); err != nil {
		t.Errorf("check of the terms recorded last: %v", err)
	}
	var mismatch *holds.PlanTermsMismatchError
	if err := e.store.CheckPlanTerms(e.ctx()); !errors.As(err, &mismatch) || mismatch.Recorded.SetBy != "gw-2" {
		t.Errorf("check of the terms replaced: %v, want a mismatch with gw-2's", err)
	}
	if prev, _, err := newer.RecordPlanTerms(e.ctx(), "gw-3"); err != nil || prev.SetBy != "gw-2" {
		t.Fatalf("record of the same terms: %+v, %v", prev, err)
	}
	if err := e.store.CheckPlanTerms(e.ctx()); !errors.As(err, &mismatch) || mismatch.Recorded.SetBy != "gw-2" {
		t.Errorf("after a serve of the same terms, recorded by %v, want gw-2 still", err)
	}
}
