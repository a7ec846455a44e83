package config

import (
	"strings"
	"testing"
)

// TestFractionInAnIntegerSettingFromAMergeKeyIsRefused: yaml.v3 decodes the fields a merge key
// brings in (`<<: {...}`, `<<: *base`, `<<: [...]`) as the mapping's own, dropping a fraction
// in an integer and reading a leading zero as octal, as it does for a field written in place,
// which TestFractionInAnIntegerSettingIsRefused refuses. The check looked at the fields written
// in place alone: `<<: {discount_bp: 0150}` gave a plan 104 basis points off, not 150, and
// `<<: {max_in_flight: 2.5}` two calls in flight, without a word.
func TestFractionInAnIntegerSettingFromAMergeKeyIsRefused(t *testing.T) {
	const fields = "    allowance_credits: 2000\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n    heavy_after_turns: 4\n    max_run_cost_credits: 500\n"
	const plan = "default_plan: pro\nplans:\n  pro:\n" + fields
	for _, tc := range []struct{ yaml, want string }{
		{plan + "    max_in_flight: 3\n    <<: {discount_bp: 0150}\n", "plans.pro.discount_bp"},
		{plan + "    <<: [{max_in_flight: 2.5}]\n", "plans.pro.max_in_flight"},
		{"default_plan: pro\nplans:\n  base: &b {max_in_flight: 3, discount_bp: 0150}\n  pro:\n" + fields + "    <<: *b\n", "plans.pro.discount_bp"},
		{"limits:\n  <<: {max_body_bytes: 4194304.9}\n", "limits.max_body_bytes"},
		{"holds:\n  <<: {reconcile_batch: 0200}\n", "holds.reconcile_batch"},
		{"models:\n  m:\n    input: 1\n    output: 1\n    <<: {max_output_tokens: 4096.5}\n", "models.m.max_output_tokens"},
	} {
		cfg, err := loadYAML(t, tc.yaml)
		if err == nil {
			t.Errorf("%q loaded (plan pro %+v); want it refused naming %s", tc.yaml, cfg.Plans["pro"], tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not a whole number") {
			t.Errorf("%q: error %v, want it to name %s as no whole number", tc.yaml, err, tc.want)
		}
	}
	// Whole numbers merged in, from an anchor or in place, load as before.
	cfg, err := loadYAML(t, "default_plan: pro\nplans:\n  std: &std\n"+fields+"    max_in_flight: 3\n  pro:\n    <<: [{max_in_flight: 10, discount_bp: 150}, *std]\n")
	if err != nil {
		t.Fatalf("whole numbers merged in refused: %v", err)
	}
	if p := cfg.Plans["pro"]; p.MaxInFlight != 10 || p.DiscountBP != 150 {
		t.Errorf("pro = %+v, want max_in_flight 10 and discount_bp 150", p)
	}
}
