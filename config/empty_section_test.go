package config

import (
	"strings"
	"testing"
)

// TestPlansOrModelsSectionWrittenEmptyIsRefused: a plans or models section replaces the
// demo's as a whole (only the plans written exist, only the models written are priced), and
// one written with no entries at all, `plans: {}`, stops the start ("no plan configured"). One
// written with no value, `plans:`, `plans: ~` or `plans: null` (a template that rendered
// nothing there; toYaml of an empty list of plans writes null), is YAML's null, which the
// decode took for the section left out: the demo's plans came back, standard's 2000 credits a
// day as every new user's plan and as the terms of every user whose plan the operator meant to
// write, without a word. It stops the start as its empty mapping does, naming the section.
func TestPlansOrModelsSectionWrittenEmptyIsRefused(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"plans:\n", "plans: no plan configured"},
		{"plans: ~\n", "plans: no plan configured"},
		{"plans: null\n", "plans: no plan configured"},
		{"default_plan: free\nplans:\n", "plans: no plan configured"},
		{"models:\n", "models: no model priced"},
		{"models: null\n", "models: no model priced"},
	} {
		cfg, err := loadYAML(t, tc.body)
		if err == nil {
			t.Errorf("%q loaded with plans %v and models %v; want it refused: %s", tc.body, sortedKeys(cfg.Plans), sortedKeys(cfg.Models), tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want %q", tc.body, err, tc.want)
		}
	}
	// Left out, the demo's stand: the file sets nothing of them.
	if _, err := loadYAML(t, "listen_addr: 127.0.0.1:8080\n"); err != nil {
		t.Errorf("a file without plans or models: %v", err)
	}
}
