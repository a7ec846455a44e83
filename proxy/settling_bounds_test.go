package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
)

// settlementsLandInTurn holds the settlements of the first n calls to reach their step, and
// lets one land each time an admission waits for a settlement: the k-th wait lets the k-th
// go. It returns the count of those waits, and a func that lets every one still held go (for
// a test's defer: a wait the code under test never made leaves its settlement held).
func settlementsLandInTurn(h *harness, n int) (waits *atomic.Int32, letAll func()) {
	gates := make([]chan struct{}, n)
	opened := make([]sync.Once, n)
	for i := range gates {
		gates[i] = make(chan struct{})
	}
	open := func(i int) { opened[i].Do(func() { close(gates[i]) }) }
	waits = new(atomic.Int32)
	var settles atomic.Int32
	h.srv.ObserveSteps(func(_ context.Context, step string) {
		switch step {
		case "settle":
			if i := int(settles.Add(1)); i <= n {
				<-gates[i-1]
			}
		case "admission waits for a settlement":
			if k := int(waits.Add(1)); k <= n {
				open(k - 1)
			}
		}
	})
	return waits, func() {
		for i := range gates {
			open(i)
		}
	}
}

// answeredAndSettling sends n calls of user's, each reported as promptTokens prompt tokens and
// 1 output token of fake-gpt (2.50 and 10 USD/M: its charge), and returns once every one is
// answered and counted as settling, its settlement held (settlementsLandInTurn).
func answeredAndSettling(t *testing.T, h *harness, user uint64, key string, n int, promptTokens int64) {
	t.Helper()
	hdr := map[string]string{fakellm.HeaderPromptTokens: strconv.FormatInt(promptTokens, 10), fakellm.HeaderChunks: "1"}
	for i := range n {
		sendOK(t, fmt.Sprintf("call %d", i+1), h.gw.URL, key, chatBody, hdr)
	}
	waitFor(t, "every answered call counted as settling", func() bool { return h.srv.SettlingCalls(user) == n })
}

// chargedAsPlanned wants the first n of user's holds charged charged each: the arithmetic the
// test's figures rest on (a hold's credits given back or not by its settlement).
func chargedAsPlanned(t *testing.T, runs []holds.Run, n int, charged int64) {
	t.Helper()
	if len(runs) < n {
		t.Fatalf("%d holds, want at least the %d answered calls'", len(runs), n)
	}
	for _, r := range runs[:n] {
		if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceComplete || r.ChargedMicro != charged {
			t.Errorf("answered call's run %s: %s by %q charged %d, want settled complete at %d (the test's arithmetic)",
				r.RunID, r.State, r.SettleSource.String, r.ChargedMicro, charged)
		}
	}
}

// chargedOrReleased wants every one of runs settled, charged unless released, a release at 0;
// want says which the test expects of each.
func chargedOrReleased(t *testing.T, runs []holds.Run, want string) {
	t.Helper()
	for _, r := range runs {
		if r.State != holds.StateSettled || (r.SettleSource.String == holds.SourceRelease) != (r.ChargedMicro == 0) {
			t.Errorf("run %s: %s by %q charged %d, want %s", r.RunID, r.State, r.SettleSource.String, r.ChargedMicro, want)
		}
	}
}

// TestAdmissionRefusedForCreditsWaitsForAtMostFourSettlements: an admission refused for want of
// credits while calls of its user settle waits for one of those settlements and tries again up
// to 4 times (README, 402 insufficient_credits and 429 too_many_in_flight: maxSettlingWaits),
// not for as long as settlements keep ending. Six answered calls each charged all their hold
// gives nothing back as they land, one at each wait: the seventh call is refused 402 after its
// fourth wait, with the last two still settling, and holds nothing.
func TestAdmissionRefusedForCreditsWaitsForAtMostFourSettlements(t *testing.T) {
	const calls = 6
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.CreditsOf(calls * 20) // six holds of the tier, 20 credits, take it all
		p.MaxInFlight = calls + 2
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	waits, letAll := settlementsLandInTurn(h, calls)
	defer letAll()
	// 7 996 prompt tokens at 2.50 USD/M and 1 output token at 10 USD/M: 20 000 µUSD, the hold.
	answeredAndSettling(t, h, u.ID, key, calls, 7996)
	refused := send(h.gw.URL, key, chatBody, nil)
	if refused.status != http.StatusPaymentRequired || errorCode(t, refused.body) != "insufficient_credits" {
		t.Errorf("a call while six calls charged their whole holds settle: %d %s; want 402 insufficient_credits",
			refused.status, refused.body)
	}
	if n := waits.Load(); n != 4 {
		t.Errorf("the refused admission waited for %d settlements, want 4 (maxSettlingWaits)", n)
	}
	letAll()
	h.settled()
	runs := h.holdsOf(u.ID)
	chargedAsPlanned(t, runs, calls, 20_000)
	if len(runs) != calls {
		t.Errorf("%d holds, want the six answered calls' alone: the refused call held nothing", len(runs))
	}
}

// TestLongPromptIsAdmittedAgainAfterAtMostFourSettlements: a long prompt whose hold the settling
// calls of its user leave too small is released and admitted again after one of them lands up
// to 4 times (README, 402 insufficient_credits: "up to 4 such waits"), each settlement raising
// its cap a little, never enough, not for as long as settlements keep ending: six answered
// calls each give back 0.2 credits of their 20 as they land, one at each wait, and the prompt
// is refused 402 for its prompt after its fourth wait, its five small holds released at 0.
func TestLongPromptIsAdmittedAgainAfterAtMostFourSettlements(t *testing.T) {
	const calls = 6
	h := newHarness(t, func(c *config.Config) {
		p := c.Plans["standard"]
		p.AllowanceCredits = config.Credits{Milli: calls*20_000 + 500} // six holds of the tier, and 0.5
		p.MaxInFlight = calls + 2
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	waits, letAll := settlementsLandInTurn(h, calls)
	defer letAll()
	// 7 916 prompt tokens and 1 output token: 19 800 µUSD, 200 of the hold given back.
	answeredAndSettling(t, h, u.ID, key, calls, 7916)
	long := send(h.gw.URL, key, longPromptBody(3000), nil)
	if long.status != http.StatusPaymentRequired || errorCode(t, long.body) != "insufficient_credits" ||
		!strings.Contains(string(long.body), "This prompt") {
		t.Errorf("a long prompt while six calls settle, each giving back a little: %d %s; want 402 insufficient_credits for its prompt",
			long.status, long.body)
	}
	if n := waits.Load(); n != 4 {
		t.Errorf("the long prompt waited for %d settlements, want 4 (maxSettlingWaits)", n)
	}
	letAll()
	h.settled()
	runs := h.holdsOf(u.ID)
	chargedAsPlanned(t, runs, calls, 19_800)
	var small int
	for _, r := range runs[min(calls, len(runs)):] {
		if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceRelease || r.ChargedMicro != 0 {
			t.Errorf("the long prompt's run %s: %s by %q charged %d, want released at 0", r.RunID, r.State, r.SettleSource.String, r.ChargedMicro)
		}
		small++
	}
	if small != 5 {
		t.Errorf("the long prompt took %d holds, want 5: its first and one after each of its 4 waits", small)
	}
}
