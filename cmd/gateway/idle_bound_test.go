package main

import (
	"context"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestServeWarnsWhenIdleTransactionsAreUnbounded: a database that never ends a transaction
// whose client went silent (MySQL; a DSN's idle_transaction_timeout=0) lets a paused gateway
// keep its users' rows locked for the whole pause. serve says so at start, and only then.
func TestServeWarnsWhenIdleTransactionsAreUnbounded(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	unbounded, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if unbounded.Params == nil {
		unbounded.Params = map[string]string{}
	}
	unbounded.Params["idle_transaction_timeout"] = "0"
	for _, tc := range []struct {
		name string
		dsn  string
		warn bool
	}{
		{"Open's default", dsn, false},
		{"idle_transaction_timeout=0", unbounded.FormatDSN(), true},
	} {
		core, logs := observer.New(zapcore.WarnLevel)
		warnUnboundedIdleTransactions(context.Background(), testenv.Open(t, tc.dsn), zap.New(core))
		warned := false
		for _, e := range logs.All() {
			w, _ := e.ContextMap()["warning"].(string)
			warned = warned || (e.Message == "database weakens a guarantee" && strings.Contains(w, "idle_transaction_timeout"))
		}
		if warned != tc.warn || logs.Len() != map[bool]int{false: 0, true: 1}[tc.warn] {
			t.Errorf("%s: logged %v; want the warning: %v", tc.name, logs.All(), tc.warn)
		}
	}
}
