package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// The ledger check after a tollgate run proves something of the run only if the run had
// charges to check: with no call answered, an empty (or earlier runs') ledger agrees with
// itself, and the check must not pass.
func TestLedgerCheckFailsWhenTheRunAnsweredNothing(t *testing.T) {
	m := proxy.NewMetrics(nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	r := &runner{db: testenv.MySQL(t)}
	run := &Run{Scenario: "hot-64", Target: "tollgate", Requests: 3, Errors: map[string]int{"status 503": 3}}
	ans := answered{ends: map[string]time.Time{}}
	if err := r.checkGateway(context.Background(), run, scenario{name: "hot-64"}, srv.URL, ans, nil, nil); err != nil {
		t.Fatal(err)
	}
	if run.Ledger == nil || run.Ledger.Pass {
		t.Errorf("ledger of a run that answered nothing: %+v, want a failure", run.Ledger)
	}
}
