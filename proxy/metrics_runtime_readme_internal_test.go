package proxy

import (
	"os"
	"strings"
	"testing"
)

// TestREADMENamesTheRuntimeSeries: /metrics serves, beside the tollgate_ series README lists
// one by one (TestDocumentedMetricsAreServed), the Go client's own collectors — go_* (the
// runtime: goroutines, GC, memory) and process_* (CPU, resident memory, open descriptors) —
// which NewMetrics registers on the gateway's registry. README says what /metrics serves, so
// it must name those families too, or an operator looking for the process's memory or
// goroutines (the leak checks § Sizing the process describes) does not know they are there.
func TestREADMENamesTheRuntimeSeries(t *testing.T) {
	m := NewMetrics(nil)
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, f := range families {
		if prefix, _, ok := strings.Cut(f.GetName(), "_"); ok && prefix != "tollgate" {
			served[prefix+"_"] = true
		}
	}
	if !served["go_"] || !served["process_"] {
		t.Fatalf("the registry serves %v; the test expects go_ and process_ families", served)
	}
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for prefix := range served {
		if !strings.Contains(string(raw), "`"+prefix+"*`") {
			t.Errorf("/metrics serves %s* series; README does not name them (`%s*`)", prefix, prefix)
		}
	}
}
