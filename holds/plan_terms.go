package holds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// PlanTerms are what a store's plans hold and charge a call by, and the plan whose terms a
// user of a plan not among them gets, as `gateway serve` records them (table plan_terms, one
// row). The operator's commands build their store from their own config's plans: one given a
// copy that fell behind the fleet's (an allowance raised since, a plan added) split a charge
// between the day's allowance and prepaid credits, or showed an allowance, by other terms than
// the gateways', with nothing to tell. The record is what such a command compares its plans
// with.
//
// Unlike credit_micro (CreditUnit), plans change routinely, and a serve with the new config
// is how: each serve records its own terms in place of those recorded, so the record is the
// last started gateway's. Those started before it serve by their own terms until they stop.
type PlanTerms struct {
	DefaultPlan string                      `json:"default_plan"`
	Plans       map[string]map[string]int64 `json:"plans"` // plan → term (planTermsOf's names) → value
}

// planTermsOf are the terms of a plan that decide what a call is held or charged, by the names
// recorded, in the order a difference is reported. max_in_flight bounds calls, not money, and
// is left out.
var planTermsOf = []struct {
	name string
	of   func(Plan) int64
}{
	{"allowance_micro", func(p Plan) int64 { return p.AllowanceMicro }},
	{"max_run_cost_micro", func(p Plan) int64 { return p.MaxRunCostMicro }},
	{"discount_bp", func(p Plan) int64 { return int64(p.DiscountBP) }},
	{"hold_normal_micro", func(p Plan) int64 { return p.HoldNormalMicro }},
	{"hold_heavy_micro", func(p Plan) int64 { return p.HoldHeavyMicro }},
	{"heavy_after_turns", func(p Plan) int64 { return int64(p.HeavyAfterTurns) }},
}

// PlanTerms are the store's own plan terms, those of the config it was built from.
func (s *Store) PlanTerms() PlanTerms {
	t := PlanTerms{DefaultPlan: s.defaultPlan, Plans: make(map[string]map[string]int64, len(s.plans))}
	for name, p := range s.plans {
		terms := make(map[string]int64, len(planTermsOf))
		for _, term := range planTermsOf {
			terms[term.name] = term.of(p)
		}
		t.Plans[name] = terms
	}
	return t
}

// PlanTermsDiff is one way two sets of plan terms differ: a term of a plan both have
// (Term set), a plan only one has (Term empty, the other's side empty), or default_plan
// (Plan empty).
type PlanTermsDiff struct {
	Plan, Term       string
	Recorded, Config string // the recorded value and the config's; "" where the plan is not
}

// String is the change from the recorded terms to the config's.
func (d PlanTermsDiff) String() string {
	switch {
	case d.Plan == "":
		return fmt.Sprintf("default_plan %q -> %q", d.Recorded, d.Config)
	case d.Term == "" && d.Recorded == "":
		return fmt.Sprintf("plan %q added", d.Plan)
	case d.Term == "":
		return fmt.Sprintf("plan %q removed", d.Plan)
	}
	return fmt.Sprintf("plan %q %s %s -> %s", d.Plan, d.Term, d.Recorded, d.Config)
}

// DiffPlanTerms lists how config's terms differ from recorded's: default_plan first, then the
// plans by name, each one's terms in planTermsOf's order. None: they are the same.
func DiffPlanTerms(recorded, config PlanTerms) []PlanTermsDiff {
	var out []PlanTermsDiff
	if recorded.DefaultPlan != config.DefaultPlan {
		out = append(out, PlanTermsDiff{Term: "default_plan", Recorded: recorded.DefaultPlan, Config: config.DefaultPlan})
	}
	names := make([]string, 0, len(recorded.Plans)+len(config.Plans))
	for name := range recorded.Plans {
		names = append(names, name)
	}
	for name := range config.Plans {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		r, inRecorded := recorded.Plans[name]
		c, inConfig := config.Plans[name]
		if !inRecorded || !inConfig {
			d := PlanTermsDiff{Plan: name}
			if inRecorded {
				d.Recorded = "configured"
			} else {
				d.Config = "configured"
			}
			out = append(out, d)
			continue
		}
		for _, term := range planTermsOf {
			rv, ok := r[term.name]
			if cv := c[term.name]; !ok || rv != cv {
				d := PlanTermsDiff{Plan: name, Term: term.name, Recorded: "none", Config: strconv.FormatInt(cv, 10)}
				if ok {
					d.Recorded = strconv.FormatInt(rv, 10)
				}
				out = append(out, d)
			}
		}
	}
	return out
}

// RecordedPlanTerms are the plan terms recorded, by the gateway that recorded them.
type RecordedPlanTerms struct {
	Terms PlanTerms
	SetBy string // the instance name of the gateway that recorded them
	SetAt time.Time
}

// ErrNoPlanTerms is a database no gateway of this version has served yet: nothing says by
// which plan terms the fleet charges.
var ErrNoPlanTerms = errors.New("no plan terms are recorded in the database: no gateway of this version has served it yet")

// PlanTermsMismatchError is a config whose plans are not the recorded ones; First is the
// first way they differ.
type PlanTermsMismatchError struct {
	Recorded RecordedPlanTerms
	First    PlanTermsDiff
}

func (e *PlanTermsMismatchError) Error() string {
	d := e.First
	var what string
	switch {
	case d.Plan == "":
		what = fmt.Sprintf("default_plan is %q in this config, %q in the fleet's", d.Config, d.Recorded)
	case d.Term == "" && d.Recorded == "":
		what = fmt.Sprintf("plan %q is in this config, not in the fleet's", d.Plan)
	case d.Term == "":
		what = fmt.Sprintf("plan %q is the fleet's, not in this config", d.Plan)
	default:
		what = fmt.Sprintf("plan %q has %s %s in this config, %s in the fleet's", d.Plan, d.Term, d.Config, d.Recorded)
	}
	return fmt.Sprintf("this config's plans are not the ones the fleet serves by (recorded by gateway %s at %s): %s",
		e.Recorded.SetBy, e.Recorded.SetAt.UTC().Format(time.RFC3339), what)
}

// planTermsRecord is where serve records the fleet's plan terms, as JSON.
var planTermsRecord = fleetRecord{table: "plan_terms", column: "terms"}

// recordedPlanTerms decodes r; an unreadable document is an error.
func recordedPlanTerms(r recorded[string]) (RecordedPlanTerms, error) {
	out := RecordedPlanTerms{SetBy: r.SetBy, SetAt: r.SetAt}
	if err := json.Unmarshal([]byte(r.Value), &out.Terms); err != nil {
		return out, fmt.Errorf("read the recorded plan terms: %w", err)
	}
	return out, nil
}

// FleetPlanTerms are the plan terms the fleet's gateways recorded (found false while nothing is
// recorded): the plans `gateway user create`, run with any config, may put a user on, and the
// one it gives a user created without one.
func (s *Store) FleetPlanTerms(ctx context.Context) (terms RecordedPlanTerms, found bool, err error) {
	rec, found, err := readRecord[string](ctx, s, planTermsRecord)
	if err != nil || !found {
		return RecordedPlanTerms{}, false, err
	}
	r, err := recordedPlanTerms(rec)
	if err != nil {
		return RecordedPlanTerms{}, false, err
	}
	return r, true, nil
}

// RecordedDefaultPlan is the default_plan the fleet's gateways recorded with their plan terms
// (found false while nothing is recorded): the plan `gateway serve` gives a user created
// without one, which `gateway user create`, run with any config, must give too.
func (s *Store) RecordedDefaultPlan(ctx context.Context) (plan string, found bool, err error) {
	r, found, err := s.FleetPlanTerms(ctx)
	return r.Terms.DefaultPlan, found, err
}

// CheckPlanTerms refuses the store's plan terms unless they are the recorded ones:
// ErrNoPlanTerms, or a *PlanTermsMismatchError.
func (s *Store) CheckPlanTerms(ctx context.Context) error {
	rec, found, err := readRecord[string](ctx, s, planTermsRecord)
	if err != nil {
		return err
	}
	if !found {
		return ErrNoPlanTerms
	}
	r, err := recordedPlanTerms(rec)
	if err != nil {
		return err
	}
	if diffs := DiffPlanTerms(r.Terms, s.PlanTerms()); len(diffs) > 0 {
		return &PlanTermsMismatchError{Recorded: r, First: diffs[0]}
	}
	return nil
}

// RecordPlanTerms records the store's plan terms, set by the instance named by, as the
// fleet's, in place of any others recorded, and returns what was recorded before (found false
// if nothing; an unreadable record is returned as one of no plans, and replaced). Terms the
// same as those recorded leave the row alone, set_by and set_at included.
func (s *Store) RecordPlanTerms(ctx context.Context, by string) (prev RecordedPlanTerms, found bool, err error) {
	mine := s.PlanTerms()
	doc, err := json.Marshal(mine)
	if err != nil {
		return RecordedPlanTerms{}, false, fmt.Errorf("record plan terms: %w", err)
	}
	rec, found, err := writeRecord(ctx, s, planTermsRecord, string(doc), by, func(cur recorded[string]) (bool, error) {
		r, err := recordedPlanTerms(cur)
		return err != nil || len(DiffPlanTerms(r.Terms, mine)) > 0, nil
	})
	if err != nil || !found {
		return RecordedPlanTerms{}, false, err
	}
	prev, _ = recordedPlanTerms(rec)
	return prev, true, nil
}
