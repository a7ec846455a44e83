package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestAUserInDebtIsToldWhatTheyOwe: README, The overdraft bound — a user whose calls cost more
// than was left owes the rest, and every call is refused 402 until a grant pays it (or a day's
// allowance is larger than it). The refusal said "today's allowance and prepaid credits are
// used or held by calls in flight", which a user refused at the first call of a new day, with
// nothing used or held, could make nothing of; it says what is owed and what ends it.
func TestAUserInDebtIsToldWhatTheyOwe(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	ctx := context.Background()
	hold, err := h.store.Admit(ctx, holds.AdmitRequest{RunID: "r_overdrawn", UserID: u.ID, Model: "fake-gpt",
		State: holds.StateRunning, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := h.store.SetUserLimits(ctx, u.ID, &zero, nil, nil); err != nil {
		t.Fatal(err)
	}
	// The call ends at its cap, past everything the user had: 500 credits owed.
	if out, err := h.store.Settle(ctx, holds.Settlement{RunID: hold.RunID, CostMicro: hold.CapMicro, Calls: 1,
		Source: holds.SourceComplete}); err != nil || out.PrepaidPart != hold.CapMicro {
		t.Fatalf("settle: %+v, %v; want the cap, %d, all from prepaid", out, err, hold.CapMicro)
	}

	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"Hello"}]}`
	h.postRefused(t, key, "/v1/chat/completions", body, nil, http.StatusPaymentRequired, "insufficient_credits")
	resp := h.post(key, "/v1/chat/completions", body, nil)
	out := string(readAll(t, resp.Body))
	resp.Body.Close()
	if !strings.Contains(out, "owes 500 credits") || !strings.Contains(out, "grant") {
		t.Fatalf("refusal of a user in debt: %d %s; want it to say 500 credits are owed and a grant pays them", resp.StatusCode, out)
	}
}
