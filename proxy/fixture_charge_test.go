package proxy_test

import (
	"context"
	"sort"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestEveryFixtureIsChargedItsExpectedCost: DESIGN §2 and §10 — every recorded provider
// response in shared/fixtures/usage, replayed through the gateway's HTTP path, takes from its
// caller's balance exactly what expected.json's usage costs: ceil(Σ tokens × price) at the
// model's prices, computed here from expected.json's figures, not from what the gateway
// recorded (TestEveryFixtureBillsItsExpectedUsage holds the recorded tokens). The run's cost
// and charge are that figure, the day ledger moved by it and nothing else, prepaid untouched
// and nothing left held; at a discount, the charge is the cost less the discount, rounded up.
// A response without a usage report is charged its estimate (the run's cost, more than 0);
// one that failed before any output, nothing.
func TestEveryFixtureIsChargedItsExpectedCost(t *testing.T) {
	expected := loadExpected(t, testenv.FixturesDir(t))
	names := fixtureNames(expected, false)
	h := newHarness(t, nil)
	ctx := context.Background()
	for _, bp := range []int{0, 3333} {
		for _, name := range names {
			want := expected[name]
			// A fresh user of the standard plan for each call: its ledger moves by this call alone.
			u, key := h.discountedUser(bp)
			path, body := fixtureRequest(name, true)
			resp := h.post(key, path, body, map[string]string{fakellm.HeaderReplay: name})
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d: %.300s", name, resp.StatusCode, answer)
			}
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))

			var cost int64
			switch {
			case errorBeforeOutput[name]:
				cost = 0
			case want.Reported:
				cost = fixtureCost(want)
				if run.CostMicro != cost {
					t.Errorf("%s (%d bp): cost %d µUSD, want %d (expected.json %+v)", name, bp, run.CostMicro, cost, want)
				}
			default:
				cost = run.CostMicro
				if cost <= 0 || !run.Estimated {
					t.Errorf("%s (%d bp): no usage reported; cost %d estimated=%v, want an estimate above 0", name, bp, cost, run.Estimated)
				}
			}
			charge := discounted(cost, bp)
			if run.State != holds.StateSettled || run.ChargedMicro != charge || run.DiscountBP != bp {
				t.Errorf("%s (%d bp): %s, charged %d at %d bp, want settled at %d (cost %d)", name, bp, run.State, run.ChargedMicro, run.DiscountBP, charge, cost)
			}
			b, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if b.UsedTodayMicro != charge || b.PrepaidMicro != 0 || b.HeldMicro != 0 || b.AllowanceMicro-b.AvailableMicro != charge {
				t.Errorf("%s (%d bp): balance %+v; want %d µUSD used today, nothing held, prepaid untouched", name, bp, b, charge)
			}
		}
	}
}

// fixtureNames lists expected's fixtures in order, only those with a usage report if reported.
func fixtureNames(expected map[string]expectedUsage, reported bool) []string {
	names := make([]string, 0, len(expected))
	for name, want := range expected {
		if want.Reported || !reported {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// fixtureCost is what a fixture's expected usage costs at fake-gpt's prices (claude-test's are
// the same): 2.50 / 1.25 / 3.125 / 10.00 USD per million tokens for input, cache_read,
// cache_write, output, rounded up once.
func fixtureCost(want expectedUsage) int64 {
	return (want.Input*2_500_000 + want.CacheRead*1_250_000 + want.CacheWrite*3_125_000 + want.Output*10_000_000 + 999_999) / 1_000_000
}

// discounted is cost less a discount of bp basis points, rounded up to the µUSD.
func discounted(cost int64, bp int) int64 { return (cost*int64(10_000-bp) + 9_999) / 10_000 }

// discountedUser is a fresh user of the standard plan with a discount of bp basis points.
func (h *harness) discountedUser(bp int) (holds.User, string) {
	h.t.Helper()
	u, key := h.user("standard")
	if bp != 0 {
		if err := h.store.SetUserLimits(context.Background(), u.ID, nil, nil, &bp); err != nil {
			h.t.Fatal(err)
		}
	}
	return u, key
}
