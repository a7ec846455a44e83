package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// agentUpstream is an Anthropic upstream as a coding agent sees it: each streamed answer
// reports the usage its request's X-Test-* headers ask for (cache reads, five-minute and
// one-hour cache writes, output), and its token counter answers a count.
type agentUpstream struct {
	gate   chan struct{} // when set, a call with X-Test-Gate waits on it before its last events
	counts atomic.Int64
	calls  atomic.Int64
}

func (u *agentUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqBody, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/v1/messages/count_tokens" {
		u.counts.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"input_tokens":1234}`))
		return
	}
	u.calls.Add(1)
	n := func(k string) int64 { v, _ := strconv.ParseInt(r.Header.Get(k), 10, 64); return v }
	in, read, w5, w1, out := n("X-Test-In"), n("X-Test-Cache-Read"), n("X-Test-Write-5m"), n("X-Test-Write-1h"), n("X-Test-Out")
	stop := "end_turn"
	if mt := gjson.GetBytes(reqBody, "max_tokens"); mt.Exists() && mt.Int() < out {
		out, stop = mt.Int(), "max_tokens" // as a provider does
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	write := func(event, data string) {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		fl.Flush()
	}
	write("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":%d},"output_tokens":1}}}`,
		in, w5+w1, read, w5, w1))
	write("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	write("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}`)
	if d, err := time.ParseDuration(r.Header.Get("X-Test-Latency")); err == nil {
		time.Sleep(d)
	}
	if r.Header.Get("X-Test-Gate") != "" && u.gate != nil {
		<-u.gate
	}
	write("content_block_stop", `{"type":"content_block_stop","index":0}`)
	write("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"%s","stop_sequence":null},"usage":{"output_tokens":%d}}`, stop, out))
	write("message_stop", `{"type":"message_stop"}`)
}

// turn is what one agent turn used.
type turn struct{ in, read, w5, w1, out int64 }

func (t turn) headers(run string) map[string]string {
	return map[string]string{"X-Run-Id": run, "X-Test-In": strconv.FormatInt(t.in, 10),
		"X-Test-Cache-Read": strconv.FormatInt(t.read, 10), "X-Test-Write-5m": strconv.FormatInt(t.w5, 10),
		"X-Test-Write-1h": strconv.FormatInt(t.w1, 10), "X-Test-Out": strconv.FormatInt(t.out, 10)}
}

func (t turn) usage() pricing.Usage {
	return pricing.Usage{Input: t.in, CacheRead: t.read, CacheWrite: t.w5 + t.w1, CacheWrite1h: t.w1, Output: t.out}
}

const agentBody = `{"model":"claude-test","max_tokens":2000,"stream":true,
	"system":[{"type":"text","text":"You are a coding agent.","cache_control":{"type":"ephemeral","ttl":"1h"}}],
	"messages":[{"role":"user","content":"fix the bug"}]}`

func agentHarness(t *testing.T, u *agentUpstream, mutate func(*config.Config)) (*harness, pricing.Price) {
	up := httptest.NewServer(u)
	t.Cleanup(up.Close)
	var price pricing.Price
	h := newHarness(t, func(c *config.Config) {
		anthropicAt(c, up.URL)
		m := c.Models["claude-test"]
		m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
		c.Models["claude-test"] = m
		if mutate != nil {
			mutate(c)
		}
		table, err := c.PriceTable()
		if err != nil {
			t.Fatal(err)
		}
		price, _, _ = table.Lookup("claude-test")
	})
	return h, price
}

// TestAgentLongRunIsChargedTheSumOfItsTurns: an agent's named run of sequential turns with a
// count_tokens before each, then bursts of parallel tool-call turns past max_in_flight through
// the Anthropic SDK (which retries the 429s), then settle: the run is charged exactly the sum of
// its turns' costs, with cache reads and five-minute and one-hour writes each at their price.
func TestAgentLongRunIsChargedTheSumOfItsTurns(t *testing.T) {
	up := &agentUpstream{}
	h, price := agentHarness(t, up, nil)
	u, key := h.user("standard")
	const name = "agent-task-1"
	var want int64
	var wantU pricing.Usage
	add := func(tr turn) {
		want += price.Cost(tr.usage())
		wantU.Input += tr.in
		wantU.CacheRead += tr.read
		wantU.CacheWrite += tr.w5 + tr.w1
		wantU.Output += tr.out
	}
	var runID string
	for i := range 12 {
		cresp := h.post(key, "/v1/messages/count_tokens", agentBody, map[string]string{"X-Run-Id": name})
		cbody := readAll(t, cresp.Body)
		cresp.Body.Close()
		if cresp.StatusCode != http.StatusOK {
			t.Fatalf("count_tokens turn %d: %d %s", i, cresp.StatusCode, cbody)
		}
		tr := turn{in: 50 + int64(i), read: 1000 * int64(i), w5: 200, out: 100 + int64(i)}
		if i == 0 {
			tr.w1 = 3000
		}
		resp := h.post(key, "/v1/messages", agentBody, tr.headers(name))
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
		add(tr)
	}
	// Bursts of parallel tool-call turns, more than max_in_flight (3) at once, through the SDK.
	var refused atomic.Int64
	c := anthropic.NewClient(aopt.WithBaseURL(h.gw.URL+"/"), aopt.WithAPIKey(key), aopt.WithMaxRetries(8),
		aopt.WithMiddleware(func(req *http.Request, next aopt.MiddlewareNext) (*http.Response, error) {
			res, err := next(req)
			if res != nil && res.StatusCode == http.StatusTooManyRequests {
				if res.Header.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After")
				}
				refused.Add(1)
			}
			return res, err
		}))
	for burst := range 3 {
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for j := range 6 {
			tr := turn{in: 10, read: 5000, w5: 0, out: 40 + int64(j)}
			add(tr)
			wg.Go(func() {
				var opts []aopt.RequestOption
				opts = append(opts, aopt.WithHeader("X-Test-Latency", "300ms"))
				for k, v := range tr.headers(name) {
					opts = append(opts, aopt.WithHeader(k, v))
				}
				st := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{
					Model: "claude-test", MaxTokens: 2000,
					Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("tool %d.%d", burst, j)))},
				}, opts...)
				for st.Next() {
				}
				if err := st.Err(); err != nil {
					errs <- fmt.Errorf("burst %d call %d: %w", burst, j, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if refused.Load() == 0 {
		t.Fatal("no burst call was refused 429: the bursts did not pass max_in_flight")
	}
	t.Logf("%d attempts refused 429 and retried", refused.Load())
	status, body := h.settleRun(key, name)
	if status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.CostMicro != want || r.ChargedMicro != want || r.Calls != 12+18 {
		t.Fatalf("run cost %d charged %d calls %d, want %d in %d calls (source %s)", r.CostMicro, r.ChargedMicro, r.Calls, want, 30, r.SettleSource.String)
	}
	if r.InTok != wantU.Input || r.CacheReadTok != wantU.CacheRead || r.CacheWriteTok != wantU.CacheWrite || r.OutTok != wantU.Output {
		t.Fatalf("run tokens in %d read %d write %d out %d, want %+v", r.InTok, r.CacheReadTok, r.CacheWriteTok, r.OutTok, wantU)
	}
	if up.counts.Load() != 12 {
		t.Errorf("%d counts reached the upstream, want 12", up.counts.Load())
	}
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d live holds after settle", live)
	}
	// A restarted agent reusing the settled name is told so, and not retried by its SDK.
	resp := h.post(key, "/v1/messages", agentBody, turn{in: 1, out: 1}.headers(name))
	body = readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("call on a settled run: %d %s %v", resp.StatusCode, body, resp.Header)
	}
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Code != "run_settled" {
		t.Fatalf("call on a settled run: %s, want Anthropic's error shape with run_settled", body)
	}
}

// TestAgentRunNeverSettledIsReconciledAtItsTally: an agent that never calls settle (Claude Code
// does not): once the run expires, the reconciler charges it exactly what its calls used.
func TestAgentRunNeverSettledIsReconciledAtItsTally(t *testing.T) {
	up := &agentUpstream{}
	h, price := agentHarness(t, up, nil)
	u, key := h.user("standard")
	const name = "agent-abandoned"
	var want int64
	var runID string
	for i := range 5 {
		tr := turn{in: 30, read: 2000 * int64(i), w5: 100, w1: 50, out: 80}
		resp := h.post(key, "/v1/messages", agentBody, tr.headers(name))
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
		want += price.Cost(tr.usage())
	}
	h.settled()
	if _, err := h.db.Exec(`UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: noLeases{}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.CostMicro != want || r.ChargedMicro != want || r.Calls != 5 || r.SettleSource.String != holds.SourceReconcile {
		t.Fatalf("reconciled run %s cost %d charged %d calls %d source %s, want %d in 5 calls from the tally",
			r.State, r.CostMicro, r.ChargedMicro, r.Calls, r.SettleSource.String, want)
	}
}

// TestAgentRunBudgetRunsOutCleanly: a run whose budget (max_run_cost) runs out over its turns:
// the turn that reaches it is answered with its output lowered to what is left (the provider's
// own max_tokens stop, a clean end in Anthropic's format), the run is charged at most its cap
// and exactly what its turns cost up to it, and the next turn is refused 402
// run_budget_exhausted in Anthropic's error shape, which the SDK does not retry.
func TestAgentRunBudgetRunsOutCleanly(t *testing.T) {
	up := &agentUpstream{}
	h, price := agentHarness(t, up, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxRunCostCredits, p.HoldNormalCredits, p.HoldHeavyCredits = config.CreditsOf(1), config.CreditsOf(1), config.CreditsOf(1)
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	const name = "agent-small-budget"
	var sum int64
	var runID string
	var stops []string
	for i := range 3 {
		tr := turn{in: 20, out: 60}
		resp := h.post(key, "/v1/messages", agentBody, tr.headers(name))
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
		runID = resp.Header.Get(proxy.RunIDHeader)
		var out int64
		for _, line := range strings.Split(string(body), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(d, "type").Str == "message_delta" {
				out = gjson.Get(d, "usage.output_tokens").Int()
				stops = append(stops, gjson.Get(d, "delta.stop_reason").Str)
			}
		}
		if !strings.Contains(string(body), "message_stop") {
			t.Fatalf("turn %d: stream not ended cleanly: %s", i, body)
		}
		tr.out = out
		sum += price.Cost(tr.usage())
		if stops[len(stops)-1] == "max_tokens" {
			break
		}
	}
	if stops[len(stops)-1] != "max_tokens" {
		t.Fatalf("stop reasons %v: no turn was lowered to the run's budget", stops)
	}
	resp := h.post(key, "/v1/messages", agentBody, turn{in: 20, out: 60}.headers(name))
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired || gjson.GetBytes(body, "type").Str != "error" ||
		gjson.GetBytes(body, "error.type").Str != "billing_error" || gjson.GetBytes(body, "error.code").Str != "run_budget_exhausted" {
		t.Fatalf("turn past the budget: %d %s, want 402 run_budget_exhausted as an Anthropic billing_error", resp.StatusCode, body)
	}
	status, sbody := h.settleRun(key, name)
	if status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, sbody)
	}
	r := h.run(u.ID, runID)
	if r.CostMicro != sum || r.ChargedMicro != min(sum, r.CapMicro) || r.ChargedMicro > 1000 {
		t.Fatalf("run cost %d charged %d cap %d, want the turns' %d, at most the cap", r.CostMicro, r.ChargedMicro, r.CapMicro, sum)
	}
	t.Logf("stops %v cost %d charged %d cap %d", stops, r.CostMicro, r.ChargedMicro, r.CapMicro)
}

// TestAgentInterruptedTurnThenSettle: the agent's user presses Esc during a turn (the SDK drops
// the stream after the first text), then the agent settles at once, and again while a later
// tool-call turn streams. The settle under the streaming turn is 409 run_busy; the run is then
// charged its complete turns plus the interrupted one at what it used (its reported input and
// writes, its output estimated).
func TestAgentInterruptedTurnThenSettle(t *testing.T) {
	up := &agentUpstream{gate: make(chan struct{})}
	h, price := agentHarness(t, up, nil)
	openGate := sync.OnceFunc(func() { close(up.gate) })
	t.Cleanup(openGate) // before the harness's cleanup, which waits for the gated call
	u, key := h.user("standard")
	const name = "agent-esc"
	full := turn{in: 40, read: 3000, w5: 500, out: 120}
	resp := h.post(key, "/v1/messages", agentBody, full.headers(name))
	readAll(t, resp.Body)
	resp.Body.Close()
	runID := resp.Header.Get(proxy.RunIDHeader)
	want := price.Cost(full.usage())

	// The interrupted turn: read up to the first text, then leave.
	cut := turn{in: 45, read: 3500, w1: 700, out: 900}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/messages", strings.NewReader(agentBody))
	req.Header.Set("x-api-key", key)
	for k, v := range cut.headers(name) {
		req.Header.Set(k, v)
	}
	req.Header.Set("X-Test-Gate", "1")
	cresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	for !strings.Contains(string(buf), "text_delta") {
		b := make([]byte, 512)
		n, err := cresp.Body.Read(b)
		buf = append(buf, b[:n]...)
		if err != nil {
			t.Fatalf("stream ended before its first text: %v %s", err, buf)
		}
	}
	cancel()
	cresp.Body.Close()
	h.settled()
	cutCost := price.Cost(pricing.Usage{Input: cut.in, CacheRead: cut.read, CacheWrite: cut.w1, CacheWrite1h: cut.w1, Output: 1})
	want += cutCost

	// A tool-call turn streaming while the agent asks to settle.
	tool := turn{in: 10, read: 4000, out: 30}
	done := make(chan []byte, 1)
	go func() {
		hdr := tool.headers(name)
		hdr["X-Test-Gate"] = "1"
		resp := h.post(key, "/v1/messages", agentBody, hdr)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- b
	}()
	waitFor(t, "the tool turn to reach the upstream", func() bool { return up.calls.Load() >= 3 })
	status, body := h.settleRun(key, name)
	if status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle under a streaming turn: %d %s, want 409 run_busy", status, body)
	}
	openGate()
	if b := <-done; !strings.Contains(string(b), "message_stop") {
		t.Fatalf("tool turn: %s", b)
	}
	want += price.Cost(tool.usage())
	status, body = h.settleRun(key, name)
	if status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.CostMicro != want || r.ChargedMicro != want || r.Calls != 3 {
		t.Fatalf("run cost %d charged %d calls %d, want %d in 3 calls (the interrupted one %d)", r.CostMicro, r.ChargedMicro, r.Calls, want, cutCost)
	}
}

// TestAgentSettleRacingItsOwnTurns: an agent settles while its sub-agents still start turns of
// the run. Whatever wins each race, every turn answered 200 is in the run's charge, and no turn
// refused is.
func TestAgentSettleRacingItsOwnTurns(t *testing.T) {
	up := &agentUpstream{}
	h, price := agentHarness(t, up, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 8
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	for round := range 20 {
		name := fmt.Sprintf("race-%d", round)
		first := turn{in: 10, out: 5}
		resp := h.post(key, "/v1/messages", agentBody, first.headers(name))
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get(proxy.RunIDHeader)
		want := price.Cost(first.usage())
		var mu sync.Mutex
		var wg sync.WaitGroup
		calls := 1
		for j := range 5 {
			tr := turn{in: 10 + int64(j), read: 100, out: 7 + int64(j)}
			wg.Go(func() {
				hdr := tr.headers(name)
				hdr["X-Test-Latency"] = fmt.Sprintf("%dms", j*3)
				resp := h.post(key, "/v1/messages", agentBody, hdr)
				b := readAll(t, resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case resp.StatusCode == http.StatusOK && strings.Contains(string(b), "message_stop"):
					want += price.Cost(tr.usage())
					calls++
				case resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusTooManyRequests:
				default:
					t.Errorf("round %d call %d: %d %s", round, j, resp.StatusCode, b)
				}
			})
		}
		var status int
		var body []byte
		wg.Go(func() { status, body = h.settleRun(key, name) })
		wg.Wait()
		if status == http.StatusConflict {
			if status, body = h.settleRun(key, name); status != http.StatusOK {
				t.Fatalf("round %d settle again: %d %s", round, status, body)
			}
		} else if status != http.StatusOK {
			t.Fatalf("round %d settle: %d %s", round, status, body)
		}
		r := h.run(u.ID, runID)
		if r.CostMicro != want || r.Calls != calls {
			t.Fatalf("round %d: run cost %d in %d calls, want %d in %d (the calls answered 200)", round, r.CostMicro, r.Calls, want, calls)
		}
	}
}

// TestAgentIdleRunRevivedByABurstWhileReconciling: the agent's user thinks past run_ttl; the
// run expires, and its next turn is a burst of parallel tool calls arriving while the
// reconciler scans. Either the reconciler settles the run first (every call of the burst is
// refused 409 run_settled, nothing more charged) or the burst revives it (the reconciler leaves
// it); the run is charged exactly what the calls answered 200 used, never more than once.
func TestAgentIdleRunRevivedByABurstWhileReconciling(t *testing.T) {
	up := &agentUpstream{}
	h, price := agentHarness(t, up, func(c *config.Config) {
		p := c.Plans["standard"]
		p.MaxInFlight = 4
		p.DiscountBP = 1500
		c.Plans["standard"] = p
	})
	u, key := h.user("standard")
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: leaseCheck{h}, Lock: alwaysLocked{}, Log: zap.NewNop(), ExtendBy: time.Minute})
	for round := range 15 {
		name := fmt.Sprintf("idle-%d", round)
		first := turn{in: 10, read: 50, w5: 20, out: 5}
		resp := h.post(key, "/v1/messages", agentBody, first.headers(name))
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get(proxy.RunIDHeader)
		want := price.Cost(first.usage())
		h.settled()
		if _, err := h.db.Exec(`UPDATE run_holds SET expires_at = NOW(6) - INTERVAL 1 SECOND WHERE run_id = ?`, runID); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		calls := 1
		if round%2 == 0 {
			// The reconciler's scan starts first.
			ready := make(chan struct{})
			wg.Go(func() {
				close(ready)
				if _, err := rec.RunOnce(context.Background()); err != nil {
					t.Error(err)
				}
			})
			<-ready
		}
		for j := range 4 {
			tr := turn{in: 10 + int64(j), read: 100, out: 7 + int64(j)}
			wg.Go(func() {
				resp := h.post(key, "/v1/messages", agentBody, tr.headers(name))
				b := readAll(t, resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case resp.StatusCode == http.StatusOK && strings.Contains(string(b), "message_stop"):
					want += price.Cost(tr.usage())
					calls++
				case resp.StatusCode == http.StatusConflict && gjson.GetBytes(b, "error.code").Str == "run_settled":
				default:
					t.Errorf("round %d call %d: %d %s", round, j, resp.StatusCode, b)
				}
			})
		}
		wg.Go(func() {
			if _, err := rec.RunOnce(context.Background()); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		r := h.run(u.ID, runID)
		if r.State != holds.StateSettled {
			if status, body := h.settleRun(key, name); status != http.StatusOK {
				t.Fatalf("round %d settle: %d %s", round, status, body)
			}
			r = h.run(u.ID, runID)
		}
		t.Logf("round %d: %s, %d calls", round, r.SettleSource.String, calls)
		if r.CostMicro != want || r.Calls != calls || r.ChargedMicro != pricing.ApplyDiscount(want, 1500) {
			t.Fatalf("round %d: run cost %d charged %d in %d calls (%s), want %d in %d", round, r.CostMicro, r.ChargedMicro,
				r.Calls, r.SettleSource.String, want, calls)
		}
	}
}

// leaseCheck is the reconciler's lease check against the harness's Redis.
type leaseCheck struct{ h *harness }

func (l leaseCheck) Exists(ctx context.Context, runID string) (bool, error) {
	n, err := l.h.rdb.Exists(ctx, l.h.keys.Lease(runID)).Result()
	return n == 1, err
}
