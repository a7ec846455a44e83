package proxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// stepLog records the store steps a call ran before forwarding (proxy ObserveSteps) and the
// deadline each ran under, and makes each slow: it answers after slow[step], or when its
// context ends, whichever comes first — a database that answers each step late but within a
// bound of its own.
type stepLog struct {
	mu    sync.Mutex
	steps []loggedStep
}

type loggedStep struct {
	name     string
	deadline time.Time
	bounded  bool
}

func (l *stepLog) observe(h *harness, slow map[string]time.Duration) {
	h.srv.ObserveSteps(func(ctx context.Context, name string) {
		if name == "settle" || name == "run call end" {
			return // after the call (settle_timeout bounds its work): not a step before forwarding
		}
		d, ok := ctx.Deadline()
		l.mu.Lock()
		l.steps = append(l.steps, loggedStep{name: name, deadline: d, bounded: ok})
		l.mu.Unlock()
		if wait, ok := slow[name]; ok {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
		}
	})
}

// oneBudget checks that every step ran under one deadline, the call's: admitTimeout from a
// moment between sent and answered (its body read whole).
func (l *stepLog) oneBudget(t *testing.T, sent, answered time.Time, admitTimeout time.Duration, want ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.steps) == 0 {
		t.Fatal("no step observed")
	}
	names := map[string]bool{}
	var budget time.Time
	for _, s := range l.steps {
		names[s.name] = true
		switch {
		case !s.bounded:
			t.Errorf("step %q ran without a deadline from its call: it took an admit_timeout of its own", s.name)
		case budget.IsZero():
			budget = s.deadline
		case !s.deadline.Equal(budget):
			t.Errorf("step %q ran until %v past the deadline of the call's first bounded step: it took an admit_timeout of its own",
				s.name, s.deadline.Sub(budget))
		}
	}
	if start := budget.Add(-admitTimeout); !budget.IsZero() && (start.Before(sent) || start.After(answered)) {
		t.Errorf("the call's steps ran until %v after it was sent, answered after %v: want admit_timeout (%v) from its arrival",
			budget.Sub(sent), answered.Sub(sent), admitTimeout)
	}
	for _, n := range want {
		if !names[n] {
			t.Errorf("steps %v: want %q among them", l.steps, n)
		}
	}
}

// TestIdempotentRetryIsAnsweredWithinOneAdmitTimeout: the steps before forwarding share one
// admit_timeout, counted from the body read whole. An Idempotency-Key retry that finds its
// attempts settled one after another (their moves lost by Redis) runs an admission, the
// attempt's row lookup (attemptPinned) and the next admission for each: each took an
// admit_timeout of its own, so with the database answering each late but within that bound, the
// caller waited 7 steps' worth — here 1.4 × admit_timeout — before it was forwarded, where
// admit_timeout promises 503 billing_unavailable, nothing held, past it.
func TestIdempotentRetryIsAnsweredWithinOneAdmitTimeout(t *testing.T) {
	const admitTimeout = time.Second
	h := newHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = admitTimeout })
	_, key := h.user("standard")
	idemKey := "budget-" + testenv.RandomID(4)
	// Attempts 0, 1 and 2 end in an upstream error: each settled at 0, unpinned, and the key moved on.
	for range 3 {
		if a := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey, fakellm.HeaderStatus: "500"}); a.status != http.StatusBadGateway {
			t.Fatalf("failing attempt: %d %s", a.status, a.body)
		}
	}
	h.settled()
	// Redis lost the moves: the record names attempt 0, and the retry finds 0, 1 and 2 settled
	// in turn (passSettled) before it admits attempt 3.
	if err := h.rdb.HSet(context.Background(), onlyIdemRecord(h), "attempt", 0).Err(); err != nil {
		t.Fatal(err)
	}
	calls := h.fake.Calls()
	var steps stepLog
	// A fifth each: seven steps are 1.4 × admit_timeout together, and the first admission,
	// the real one after its slowed step, has four fifths of the budget to end in before the
	// lookup the test wants among its steps (at two fifths a loaded machine's 600 ms admission
	// refused the call first).
	slow := admitTimeout / 5
	steps.observe(h, map[string]time.Duration{"admit": slow, "attempt pinned": slow})
	sent := time.Now()
	a := send(h.gw.URL, key, chatBody, map[string]string{proxy.IdempotencyKeyHeader: idemKey})
	answered := time.Now()
	took := answered.Sub(sent)
	h.settled()
	steps.oneBudget(t, sent, answered, admitTimeout, "admit", "attempt pinned")
	if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
		t.Errorf("retry whose steps outlast admit_timeout together: %d %s after %v; want 503 billing_unavailable", a.status, a.body, took)
	}
	if n := h.fake.Calls(); n != calls {
		t.Errorf("%d upstream calls, want none", n-calls)
	}
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d live holds after the refusal, want none", live)
	}
}

// TestHeldCallsChecksShareItsAdmitTimeout: a call's checks after its hold — a named run's
// reservation, a session's claim, a plain call's fingerprint whose holder must be looked up —
// run within what is left of the admit_timeout its admission began, not a bound of their own
// each: a slow admission then a slow check forwarded the call after about 1.1 × admit_timeout
// here. Past the budget the caller is answered 503 billing_unavailable (not 499 as a caller that
// left) and its hold released at 0 (a named run's left open, as any failed call leaves it),
// nothing charged, nothing forwarded.
func TestHeldCallsChecksShareItsAdmitTimeout(t *testing.T) {
	const admitTimeout = time.Second
	for _, tc := range []struct {
		name, step string
		hdr        func(h *harness, userID uint64) map[string]string
		// named: a named run's call, whose failure leaves its run open (its hold live,
		// settled later from its tally: at 0 here).
		named bool
	}{
		{"named run reservation", "run budget reservation", func(*harness, uint64) map[string]string {
			return map[string]string{"X-Run-Id": "budget-" + testenv.RandomID(4)}
		}, true},
		{"session claim", "session claim", func(*harness, uint64) map[string]string {
			return map[string]string{proxy.SessionHeader: "budget-" + testenv.RandomID(4)}
		}, false},
		{"fingerprint", "fingerprint run live", func(h *harness, userID uint64) map[string]string {
			// The window names a run that has ended (none): the check looks it up, then takes it over.
			sum := sha256.Sum256([]byte("/v1/chat/completions\x00" + chatBody))
			if err := h.rdb.Set(context.Background(), h.keys.Dedup(userID, hex.EncodeToString(sum[:])),
				"r_"+strings.Repeat("0", 32), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			return nil
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) { c.Limits.AdmitTimeout = admitTimeout })
			u, key := h.user("standard")
			hdr := tc.hdr(h, u.ID)
			calls := h.fake.Calls()
			var steps stepLog
			// The admission slowed by a fifth, the check by nine tenths: together past the
			// budget, each within one of its own. The check is reached only if the admission,
			// the real one after the slowed step, ends within the budget: at three fifths a
			// loaded machine's admission taking 400 ms (a batch descheduled, a slow fsync)
			// refused the call before the check, which the test wants among its steps.
			steps.observe(h, map[string]time.Duration{"admit": admitTimeout / 5, tc.step: 9 * admitTimeout / 10})
			sent := time.Now()
			a := send(h.gw.URL, key, chatBody, hdr)
			answered := time.Now()
			h.settled()
			steps.oneBudget(t, sent, answered, admitTimeout, "admit", tc.step)
			if a.status != http.StatusServiceUnavailable || errorCode(t, a.body) != "billing_unavailable" {
				t.Errorf("call whose admission and %s outlast admit_timeout together: %d %s after %v; want 503 billing_unavailable",
					tc.step, a.status, a.body, answered.Sub(sent))
			}
			if n := h.fake.Calls(); n != calls {
				t.Errorf("%d upstream calls, want none", n-calls)
			}
			var charged int64
			if err := h.db.Get(&charged, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			if _, live := h.holdCount(); (live != 0) != tc.named || charged != 0 {
				t.Errorf("%d live holds, %d charged after the refusal; want the hold released at 0 (a named run's left open)", live, charged)
			}
		})
	}
}
