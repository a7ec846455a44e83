package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestInFlightRefusalNamesTheOpenRunsHoldingItsSlots: README, Agents — a named run is one hold,
// and it keeps its slot of max_in_flight between its calls until it is settled or idle past
// run_ttl. An agent framework that left runs open (a crashed worker, a task never settled) had
// every later call refused 429 "N calls are already in flight for this account … Retry when one
// finishes" with nothing in flight: no call was going to finish, the SDK's retries a second
// apart all failed, and nothing told the caller that settling its runs frees the slots. The
// refusal now says how many of the holds are open runs, and how they are freed.
func TestInFlightRefusalNamesTheOpenRunsHoldingItsSlots(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	two := 2
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, &two, nil); err != nil {
		t.Fatal(err)
	}
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-left-open-1"}, 3)
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-left-open-2"}, 3)

	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, body) != "too_many_in_flight" {
		t.Fatalf("a call with both slots held by open runs: %d %s, want 429 too_many_in_flight", resp.StatusCode, body)
	}
	msg := gjson.GetBytes(body, "error.message").Str
	if strings.Contains(msg, "calls are already in flight") || !strings.Contains(msg, "2 of them named runs") ||
		!strings.Contains(msg, "/v1/runs/{id}/settle") {
		t.Fatalf("refusal %q: says calls are in flight when none is, or does not say that the 2 open named runs hold the slots until settled", msg)
	}

	// Settling one frees its slot at once.
	if status, b := h.settleRun(key, "task-left-open-1"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, b)
	}
	h.postOK(t, key, "/v1/chat/completions", chatBody, nil) // a call once a run is settled

}
