package proxy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestEveryFixtureInANamedRunIsChargedItsExpectedCost: every recorded response with a usage
// report, replayed as the calls of named runs (X-Run-Id) and settled by POST
// /v1/runs/{id}/settle, is charged what expected.json's usage costs — per call ceil(Σ tokens ×
// price), the run's cost their sum, its charge the discount off that sum rounded up — and the
// day ledger moves by the run's charge alone.
func TestEveryFixtureInANamedRunIsChargedItsExpectedCost(t *testing.T) {
	expected := loadExpected(t, testenv.FixturesDir(t))
	names := fixtureNames(expected, true)
	h := newHarness(t, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	ctx := context.Background()
	for _, bp := range []int{0, 3333} {
		// One run per fixture, then one run of all of them.
		runs := map[string][]string{}
		for _, name := range names {
			runs["one-"+name[:min(len(name), 40)]] = []string{name}
		}
		runs["all"] = names
		for id, calls := range runs {
			u, key := h.discountedUser(bp)
			var cost int64
			var runID string
			for _, name := range calls {
				path, body := fixtureRequest(name, true)
				resp := h.post(key, path, body, map[string]string{fakellm.HeaderReplay: name, "X-Run-Id": id})
				runID = resp.Header.Get(proxy.RunIDHeader)
				answer := readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%s in run %s: status %d: %.300s", name, id, resp.StatusCode, answer)
				}
				cost += fixtureCost(expected[name])
			}
			h.settled()
			if status, body := h.settleRun(key, id); status != http.StatusOK {
				t.Fatalf("settle %s: %d %s", id, status, body)
			}
			run := h.run(u.ID, runID)
			charge := discounted(cost, bp)
			if run.State != holds.StateSettled || run.CostMicro != cost || run.ChargedMicro != charge {
				t.Errorf("run %s (%d bp, %d calls): %s cost %d charged %d, want cost %d charged %d", id, bp, len(calls), run.State, run.CostMicro, run.ChargedMicro, cost, charge)
			}
			b, err := testenv.BalanceAllDays(ctx, h.store, u.ID)
			if err != nil {
				t.Fatal(err)
			}
			if b.UsedTodayMicro != charge || b.HeldMicro != 0 || b.PrepaidMicro != 0 {
				t.Errorf("run %s (%d bp): balance %+v, want %d used today, nothing held", id, bp, b, charge)
			}
		}
	}
}
