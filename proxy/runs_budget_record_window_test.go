package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
)

// gateFirstRelease holds the first run-budget release (the script whose fourth key is its run's
// lost mark) until open is closed: the moment between a call's end and its tally landing.
type gateFirstRelease struct {
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (g *gateFirstRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gateFirstRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		// The release's fourth key is the run's lost mark (the reservation has three).
		if n := strings.ToLower(cmd.Name()); (n == "evalsha" || n == "eval") && len(args) > 6 {
			if k, _ := args[6].(string); strings.Contains(k, "billing:lost:") {
				first := false
				g.once.Do(func() { first = true })
				if first {
					close(g.entered)
					select {
					case <-g.open:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (g *gateFirstRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestNamedRunBudgetCountsAnEndedCallOnce: a named run's call is counted against its cap once:
// by its reservation while it runs, by its cost once it has ended. The row's record of the
// ended calls (counted as spent since 7c90b8b) was written before the call's tally, which is
// what gives its reservation back: a call of the run reserving in between found the ended
// call counted twice — its cost on the row and its reservation — and was refused
// run_budget_exhausted (or given less than it could spend) with half the cap unused.
func TestNamedRunBudgetCountsAnEndedCallOnce(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out := 48 // the first call spends nearly what it reserved
		if strings.Contains(string(body), "second") {
			out = 5
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":`+strconv.Itoa(out)+`,"total_tokens":`+strconv.Itoa(10+out)+`}}`)
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up.URL })
	u, key := h.user("standard")
	allowance := int64(1_000) // the run's cap: 1 000 µUSD
	if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, nil, nil); err != nil {
		t.Fatal(err)
	}
	gate := &gateFirstRelease{entered: make(chan struct{}), open: make(chan struct{})}
	h.rdb.AddHook(gate)
	run := map[string]string{"X-Run-Id": "task-window"}

	// The first call reserves ~520 (max_tokens 50) and spends 505; its tally is held back.
	first := make(chan *http.Response, 1)
	go func() {
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":50,"messages":[{"role":"user","content":"first"}]}`, run)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp
	}()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call's tally never went out")
	}
	// The first call has ended; the run has ~480 left however it is counted once.
	second := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":10,"messages":[{"role":"user","content":"second"}]}`, run)
	body := readAll(t, second.Body)
	second.Body.Close()
	close(gate.open)
	firstResp := <-first
	if firstResp.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d", firstResp.StatusCode)
	}
	if second.StatusCode != http.StatusOK {
		t.Fatalf("second call of a run with about half its cap left: %d %s (the first call counted twice: its recorded cost and its reservation)",
			second.StatusCode, body)
	}
	h.settled()
	if status, b := h.settleRun(key, "task-window"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, b)
	}
	r := h.run(u.ID, firstResp.Header.Get("X-Tollgate-Run-Id"))
	if want := fakeGPTCost(10, 48) + fakeGPTCost(10, 5); r.CostMicro != want || r.Calls != 2 {
		t.Fatalf("run %+v: want 2 calls costing %d", r, want)
	}
}
