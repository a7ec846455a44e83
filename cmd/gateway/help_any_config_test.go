package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestHelpDoesNotSayUserCreateRunsWithAnyConfig: `gateway help` ended by listing the commands
// that "run with any config", user create among them. It does not: without -plan it refuses a
// config whose default_plan is not the one the gateways recorded, and with -plan one the
// gateways serve no terms for (TestUserCreateWithoutPlanGetsTheFleetsDefaultPlan,
// TestUserCreateRefusesAPlanTheFleetDoesNotServe; README § Plan terms says so). An operator who
// read the help ran it with the config at hand and was refused, or — the reverse case the check
// exists for — trusted a config the help said did not matter. The help must list user create
// among the commands that check, and not among those that run with any config.
func TestHelpDoesNotSayUserCreateRunsWithAnyConfig(t *testing.T) {
	text := strings.Join(strings.Fields(usage), " ")
	m := regexp.MustCompile(`The others \(([^)]*)\) run with any config`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("gateway help no longer says which commands run with any config: %q", text)
	}
	if strings.Contains(m[1], "user create") {
		t.Errorf("gateway help says %q run with any config; user create refuses a default_plan or -plan the gateways do not serve", m[1])
	}
	if !strings.Contains(text, "user create refuses") {
		t.Errorf("gateway help does not say what user create checks against the gateways' plans")
	}
}
