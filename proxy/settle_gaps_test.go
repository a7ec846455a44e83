package proxy_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestPlainCallsTallyLostOnTwoTriesLandsOnALaterOne: a plain call's tally, written beside its
// settlement (on a tally client of its own, as under Redis Cluster), is lost on its first try
// and on the first try again (a Redis blip a few hundred ms long), and the database stays out
// of reach for the whole settlement. The tries go on until one lands (tallyPlainCall), not
// just once more: the reconciler then settles the run from the tally at the call's usage, not
// at its hold. And a tally that landed is not logged as never written: that line tells the
// operator the run is charged its hold.
func TestPlainCallsTallyLostOnTwoTriesLandsOnALaterOne(t *testing.T) {
	lossy := testenv.NewLossyRedis(t)
	dsn, lossyDB := testenv.LossyMySQLDSN(t)
	core, logs := observer.New(zapcore.WarnLevel)
	h := newHarnessOn(t, harnessSetup{db: testenv.Open(t, dsn), tallyDialer: lossy.Dial, log: zap.New(core)},
		func(c *config.Config) { c.Limits.SettleTimeout = 2 * time.Second })
	u, key := h.user("standard")
	reached, resume := h.holdAtFirst("settle")
	resp := h.post(key, "/v1/chat/completions", streamBody,
		map[string]string{fakellm.HeaderChunks: "5", fakellm.HeaderChunkInterval: "100ms"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	// Each try is one MULTI/EXEC, which go-redis does not resend: two tries lost.
	lossy.Arm(h.keys.Usage(runID), testenv.RedisRequestLost, 2)
	readAll(t, resp.Body)
	resp.Body.Close()
	<-reached // the answer is whole; the tally's tries run beside the settlement
	lossyDB.TakeDown()
	resume()
	h.settled() // the settlement has given up; the tally's tries have landed or given up
	lossyDB.Restore()
	if lossy.Fired() != 2 {
		t.Fatalf("%d tally writes lost, want 2", lossy.Fired())
	}
	if got := h.run(u.ID, runID); got.State == holds.StateSettled {
		t.Fatalf("run settled with the database out of reach: %+v", got)
	}
	if tl, found, err := h.tally.Get(context.Background(), runID); err != nil || !found || tl.Calls != 1 || tl.Usage.Output != 5 {
		t.Fatalf("tally %+v found=%v err=%v: want the call's 5 output tokens, landed on its third try", tl, found, err)
	}
	if n := logs.FilterMessageSnippet("tally never written").Len() + logs.FilterMessageSnippet("tally not set").Len(); n != 0 {
		t.Errorf("%d lines say the call's tally never landed; it landed on its third try", n)
	}

	h.reconcileExpired(t, "run_id = ?", runID)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceReconcile || r.OutTok != 5 ||
		r.ChargedMicro != fakeGPTCost(r.InTok, 5) || r.ChargedMicro >= r.HeldMicro {
		t.Fatalf("run %s settled as %s by %q, charged %d µUSD of %d held (%d in, %d out tokens); want its usage from its tally (%s)",
			runID, r.State, r.SettleSource.String, r.ChargedMicro, r.HeldMicro, r.InTok, r.OutTok, holds.SourceReconcile)
	}
}

// TestNamedRunCallRefusedByItsUpstreamGivesBackItsLease: a named run's call the upstream
// refused (503, answered 502) is never tallied before its answer (tallyBeforeAnswer, which
// gives a whole answer's lease back), so its end (finishRunCall) must drop the lease it took
// before forwarding: kept, the heartbeat refreshes it for as long as the process lives, the
// run's settle is refused while it stands, and the reconciler, which leaves leased runs alone,
// never settles a run its agent does not come back to.
func TestNamedRunCallRefusedByItsUpstreamGivesBackItsLease(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody,
		map[string]string{"X-Run-Id": "lease-of-a-refused-call", fakellm.HeaderStatus: "503"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("refused call: %d %s, want 502", resp.StatusCode, body)
	}
	h.settled()
	if n := h.leases.Held(); n != 0 {
		t.Fatalf("the process still holds %d leases after its named run's refused call ended", n)
	}
}

// TestFailedSettlementDeletesItsWrittenLeaseKey: a call whose lease a heartbeat has written to
// Redis, and whose settlement gives up once its settle_timeout has run out (a database stalled
// for all of it), still deletes that key: the release has a deadline of its own, not the spent
// one of the settlement. Left, the key keeps a peer's reconciler off the run until lease_ttl
// lapses.
func TestFailedSettlementDeletesItsWrittenLeaseKey(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.SettleTimeout = time.Second })
	_, key := h.user("standard")
	ctx := context.Background()
	var stalled atomic.Bool
	h.srv.ObserveSteps(func(sctx context.Context, step string) {
		if step == "settle" && stalled.CompareAndSwap(false, true) {
			<-sctx.Done() // the settlement's settle_timeout runs out before it reaches the database
		}
	})
	resp := h.post(key, "/v1/chat/completions", streamBody,
		map[string]string{fakellm.HeaderChunks: "5", fakellm.HeaderChunkInterval: "100ms"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	runID := resp.Header.Get(proxy.RunIDHeader)
	// A heartbeat writes the lease of the call in flight.
	if err := h.leases.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := h.rdb.Exists(ctx, h.keys.Lease(runID)).Result(); err != nil || n != 1 {
		t.Fatalf("lease key of the call in flight: %d, %v; want it written", n, err)
	}
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	if !stalled.Load() {
		t.Fatal("the call's settlement never started")
	}
	if got := h.metric("tollgate_settle_failures_total"); got != "1" {
		t.Fatalf("settle failures %q, want 1", got)
	}
	if n, err := h.rdb.Exists(ctx, h.keys.Lease(runID)).Result(); err != nil || n != 0 {
		t.Fatalf("lease key of run %s after its settlement gave up: %d, %v; want it deleted", runID, n, err)
	}
}

// TestAnthropicUsageWithoutInputTokensBillsTheRestOfThePromptAtTheWritePrice: an Anthropic
// usage without input_tokens that counts the prompt's cache reads and writes
// (cache_read_input_tokens, cache_creation_input_tokens), for a request that marks its prompt
// with cache_control. The prompt's estimate less what the report says was read from or written
// to the cache is its input (both taken out: the provider bills them apart, at their prices),
// and, marked for the cache, that input is billed at the cache-write price, as a call without
// any report is: the provider may have written it there.
func TestAnthropicUsageWithoutInputTokensBillsTheRestOfThePromptAtTheWritePrice(t *testing.T) {
	const read, written = 200, 300
	dir := t.TempDir()
	writeFixture(t, dir, "anth_cache_no_input.json", `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test",
"content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn",
"usage":{"output_tokens":30,"cache_read_input_tokens":`+strconv.Itoa(read)+`,"cache_creation_input_tokens":`+strconv.Itoa(written)+`}}`)
	var price pricing.Price
	h := newHarnessWithFixtures(t, dir, func(c *config.Config) {
		m := c.Models["claude-test"]
		price = pricing.Price{Input: m.Input.Micro, CacheRead: m.CacheRead.Micro, CacheWrite: m.CacheWrite.Micro,
			CacheWrite1h: m.CacheWrite1h.Micro, Output: m.Output.Micro}
	})
	u, key := h.user("standard")
	body := `{"model":"claude-test","max_tokens":100,"system":[{"type":"text","text":"` +
		strings.Repeat("You are a careful coding agent. ", 200) + `","cache_control":{"type":"ephemeral"}}],` +
		`"messages":[{"role":"user","content":"fix the bug"}]}`
	est, _ := metering.EstimatePrompt(metering.FormatAnthropic, []byte(body))
	if est <= read+written {
		t.Fatalf("prompt estimate %d: the test needs more than the %d tokens the cache had", est, read+written)
	}
	run, _ := h.answeredRun(u.ID, key, "/v1/messages", body, map[string]string{fakellm.HeaderReplay: "anth_cache_no_input.json"})
	want := pricing.Usage{Input: est - read - written, CacheRead: read, CacheWrite: written, Output: 30}
	if got := run.Usage(); got != want || !run.Estimated {
		t.Fatalf("settled %+v (estimated %v), want %+v, estimated: the prompt's estimate %d less what the cache read and wrote",
			got, run.Estimated, want, est)
	}
	if at := price.PromptWritten(false).Cost(want); run.CostMicro != at || at == price.Cost(want) {
		t.Errorf("cost %d µUSD, want %d: the input at the cache-write price (%d at the input price)", run.CostMicro, at, price.Cost(want))
	}
}

// TestSettlementRunsUnderItsSettleTimeout: a call's settlement reaches the database with a
// deadline settle_timeout away at most, however long the request's own context lives (it
// outlives the request, detached from it): the drain waits for settlements within the exit's
// bound (drain + settle_timeout + 5 s), and a settlement behind a stalled database must give
// up within it, leaving the run to the reconciler, rather than hold the exit past it.
func TestSettlementRunsUnderItsSettleTimeout(t *testing.T) {
	const settleTimeout = 2 * time.Second
	h := newHarness(t, func(c *config.Config) { c.Limits.SettleTimeout = settleTimeout })
	_, key := h.user("standard")
	left := make(chan time.Duration, 1)
	h.srv.ObserveSteps(func(sctx context.Context, step string) {
		if step != "settle" {
			return
		}
		d, ok := sctx.Deadline()
		if !ok {
			d = time.Now().Add(time.Hour)
		}
		select {
		case left <- time.Until(d):
		default:
		}
	})
	h.postOK(t, key, "/v1/chat/completions", chatBody, nil)
	h.settled()
	select {
	case d := <-left:
		if d > settleTimeout {
			t.Fatalf("settlement's deadline %v away, want at most settle_timeout (%v)", d, settleTimeout)
		}
	default:
		t.Fatal("the call's settlement never started")
	}
}
