package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// TestAgentRunSettledOnce: an agent run of several calls through one X-Run-Id on a real
// gateway process — non-streamed and streamed calls, one refused for the run's budget — is
// settled once by POST /v1/runs/{id}/settle with the sum of its calls' usage; a second settle
// changes nothing and a later call is refused.
func TestAgentRunSettledOnce(t *testing.T) {
	w := newWorld(t)
	// 30 credits available: the run's cap is 30 000 µUSD, so three calls of ~1 000 output
	// tokens (10 000 µUSD each at $10/M) cannot all fit.
	allowance := int64(30_000)
	u, key := w.user("agent", 3, &allowance)
	// The run outlives the test (w.longRuns): idle past the worlds' 3 s run_ttl between its
	// last call and the agent's settle, a loaded machine's pause, it was the reconciler's to
	// settle, and the settle found it settled by another hand.
	g := w.startGatewayWith("gw-runs", w.longRuns())
	const name = "task-7"
	run := map[string]string{"X-Run-Id": name}

	// Call 1: non-streamed.
	runID, use1 := completeCall(t, g, key, chatBody(false, 1000, "plan the task"), with(run, "X-Fake-Chunks", "1000"))
	// Call 2: streamed; the client asks for usage so the test can see what was billed.
	use2, id2 := streamedCall(t, g, key, with(run, "X-Fake-Chunks", "1000"))
	if id2 != runID {
		t.Fatalf("second call ran as %s, want the run %s", id2, runID)
	}
	spent := w.price.Cost(use1) + w.price.Cost(use2)
	if spent >= allowance {
		t.Fatalf("test setup: two calls cost %d, want them under the cap %d", spent, allowance)
	}

	// Call 3: its prompt alone costs more than the run has left.
	big := strings.Repeat("lorem ipsum dolor sit amet ", 2500) // ~67 KB: ~17 000 input tokens
	resp := post(t, context.Background(), g, key, chatBody(false, 10, big), run)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(raw), "run_budget_exhausted") {
		t.Fatalf("call over the run budget: %d %s, want 402 run_budget_exhausted", resp.StatusCode, raw)
	}

	// Call 4: small, fits what is left.
	_, use4 := completeCall(t, g, key, chatBody(false, 100, "wrap up"), with(run, "X-Fake-Chunks", "100"))
	want := use1.Add(use2).Add(use4)
	wantCost := spent + w.price.Cost(use4)

	// The run is live and shows its tally.
	view := getJSON(t, g, key, http.MethodGet, "/v1/runs/"+name)
	if view["state"] != "running" {
		t.Fatalf("run before settle: %v", view)
	}

	view = getJSON(t, g, key, http.MethodPost, "/v1/runs/"+name+"/settle")
	if view["state"] != "settled" || view["settle_source"] != holds.SourceClient {
		t.Fatalf("settle answer: %v", view)
	}
	r := w.hold(runID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceClient || r.Calls != 3 ||
		r.InTok != want.Input || r.OutTok != want.Output || r.CostMicro != wantCost || r.ChargedMicro != wantCost {
		t.Errorf("settled run: calls %d in %d out %d cost %d charged %d source %q; want 3 calls in %d out %d cost=charged %d by client",
			r.Calls, r.InTok, r.OutTok, r.CostMicro, r.ChargedMicro, r.SettleSource.String, want.Input, want.Output, wantCost)
	}
	if got := w.ledgerUsed(u.ID); got != wantCost {
		t.Errorf("day ledger %d, want %d", got, wantCost)
	}

	// Settling again is an answer, not a charge.
	getJSON(t, g, key, http.MethodPost, "/v1/runs/"+name+"/settle")
	if got := w.ledgerUsed(u.ID); got != wantCost {
		t.Errorf("day ledger after a second settle %d, want %d (one charge)", got, wantCost)
	}
	// A later call naming the settled run is refused.
	resp = post(t, context.Background(), g, key, chatBody(false, 10, "one more"), run)
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(raw), "run_settled") {
		t.Errorf("call on a settled run: %d %s, want 409 run_settled", resp.StatusCode, raw)
	}
	if n := w.liveHolds(); n != 0 {
		t.Errorf("%d holds left live", n)
	}
}

func with(h map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for hk, hv := range h {
		out[hk] = hv
	}
	return out
}

// streamedCall makes a streamed call with include_usage and returns the usage in its stream.
func streamedCall(t *testing.T, g *gateway, key string, hdr map[string]string) (pricing.Usage, string) {
	t.Helper()
	return streamedCallThen(t, g, key, hdr, nil)
}

// streamedCallThen is streamedCall calling first, when it is not nil, once the first event
// has arrived: the call is admitted and forwarding, and its stream read on when first returns.
func streamedCallThen(t *testing.T, g *gateway, key string, hdr map[string]string, first func()) (pricing.Usage, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "fake-gpt", "stream": true, "max_tokens": 1000,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": "do the step"}}})
	resp := post(t, context.Background(), g, key, body, hdr)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, raw)
	}
	var use pricing.Usage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		if first != nil {
			first()
			first = nil
		}
		var ev struct {
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Usage != nil {
			use = pricing.Usage{Input: ev.Usage.Prompt, Output: ev.Usage.Completion}
		}
	}
	if err := sc.Err(); err != nil || use.Output == 0 {
		t.Fatalf("stream: usage %+v, err %v", use, err)
	}
	return use, resp.Header.Get("X-Tollgate-Run-Id")
}

// getJSON calls a JSON endpoint that must answer 200.
func getJSON(t *testing.T, g *gateway, key, method, path string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(method, g.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, raw)
	}
	return out
}
