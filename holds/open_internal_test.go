package holds

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/config"
)

// TestOpenReadTimeoutIsTheConfigsDefault: the configuration checks limits.settle_timeout
// against the read timeout Open sets when the DSN sets none (a settlement's last script is
// waited for up to it past its deadline); config cannot import this package to read it.
func TestOpenReadTimeoutIsTheConfigsDefault(t *testing.T) {
	if defaultReadTimeout != config.DefaultDBReadTimeout {
		t.Fatalf("Open's read timeout %v, config.DefaultDBReadTimeout %v: the settle_timeout check counts the wrong wait",
			defaultReadTimeout, config.DefaultDBReadTimeout)
	}
}

// TestModelLenIsTheConfigsBound: the configuration refuses a price or upstream entry whose
// name no call could be recorded under (past MaxModelLen, refused model_too_long); config
// cannot import this package to read it.
func TestModelLenIsTheConfigsBound(t *testing.T) {
	if MaxModelLen != config.MaxModelNameLen {
		t.Fatalf("MaxModelLen %d, config.MaxModelNameLen %d: the configuration checks model names against the wrong bound",
			MaxModelLen, config.MaxModelNameLen)
	}
}

// TestOpenAdaptsOnlyItsOwnSettingsToTheServer: Open sets session variables some servers do
// not know (MySQL has no idle_transaction_timeout, MariaDB before 11.1 knows the isolation only
// as tx_isolation) and, refused one as unknown, opens again without it or by its other name —
// each once, so a server refusing the same name again ends the attempts. A variable the DSN
// asked for is the operator's: refused, it fails Open.
func TestOpenAdaptsOnlyItsOwnSettingsToTheServer(t *testing.T) {
	unknown := func(name string) error {
		return fmt.Errorf("mysql u@h: %w", &mysql.MySQLError{Number: 1193, Message: "Unknown system variable '" + name + "'"})
	}
	if got := unknownVariable(unknown("idle_transaction_timeout")); got != "idle_transaction_timeout" {
		t.Fatalf("unknownVariable of a wrapped 1193: %q", got)
	}
	if got := unknownVariable(&mysql.MySQLError{Number: 1045, Message: "Access denied for user 'u'"}); got != "" {
		t.Fatalf("unknownVariable of an access error: %q, want none", got)
	}

	s := sessionVars{isolation: "transaction_isolation", idleTransactionTimeout: true}
	for _, step := range []struct {
		refused  string
		adapted  bool
		wantIso  string
		wantIdle bool
	}{
		{"idle_transaction_timeout", true, "transaction_isolation", false}, // MySQL 8
		{"transaction_isolation", true, "tx_isolation", false},             // and old
		{"tx_isolation", false, "tx_isolation", false},                     // refused again: give up
	} {
		next, ok := s.without(unknownVariable(unknown(step.refused)))
		if ok != step.adapted || (ok && (next.isolation != step.wantIso || next.idleTransactionTimeout != step.wantIdle)) {
			t.Fatalf("refused %s from %+v: %+v, %v; want isolation %s, idle %v, adapted %v",
				step.refused, s, next, ok, step.wantIso, step.wantIdle, step.adapted)
		}
		if ok {
			s = next
		}
	}
	fresh := sessionVars{isolation: "transaction_isolation", idleTransactionTimeout: true}
	for _, name := range []string{"", "sql_mode", "idle_transaction_timeout_x"} {
		if _, ok := fresh.without(name); ok {
			t.Fatalf("refused %q (not Open's own): adapted, want Open to fail", name)
		}
	}
	if _, ok := (sessionVars{isolation: "tx_isolation"}).without("idle_transaction_timeout"); ok {
		t.Fatal("refused idle_transaction_timeout that Open no longer sets (the DSN's): adapted, want Open to fail")
	}
}

// TestIdleBoundIsShorterThanALockWait: an admission waiting on a row that a silent gateway's
// transaction holds gets it within its first lock wait only while the server ends that
// transaction sooner than the wait ends (SessionIdleTransactionTimeout's promise: a stopped
// gateway delays its users elsewhere, and refuses none).
func TestIdleBoundIsShorterThanALockWait(t *testing.T) {
	if SessionIdleTransactionTimeout >= time.Duration(lockWaitSeconds)*time.Second {
		t.Fatalf("idle transaction bound %v, lock wait %d s: a waiter may time out first", SessionIdleTransactionTimeout, lockWaitSeconds)
	}
}
