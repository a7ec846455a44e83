package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

const streamBody = `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Stream to the billing team, please."}]}`

// with is hdr plus k: v.
func with(hdr map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for hk, hv := range hdr {
		out[hk] = hv
	}
	return out
}

// slowStream makes fakellm stream n chunks 20 ms apart: long enough to act while it runs.
func slowStream(n int, hdr map[string]string) map[string]string {
	out := map[string]string{fakellm.HeaderChunks: fmt.Sprint(n), fakellm.HeaderChunkInterval: "20ms"}
	for k, v := range hdr {
		out[k] = v
	}
	return out
}

// firstEvent reads a stream up to its first event, so the call is surely running upstream.
func firstEvent(t *testing.T, resp *http.Response) *bufio.Reader {
	t.Helper()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("first event: %v", err)
	}
	return br
}

// toDone reads a chat stream up to its final event, [DONE]: the caller has the whole answer,
// though the upstream may not have closed.
func toDone(t *testing.T, br *bufio.Reader) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before [DONE]: %v", err)
		}
		if strings.TrimSpace(line) == "data: [DONE]" {
			return
		}
	}
}

// afterContent reads a stream's events until n content chunks ("tok…") have arrived, and
// returns the reader to go on with.
func afterContent(t *testing.T, resp *http.Response, n int) *bufio.Reader {
	t.Helper()
	br := bufio.NewReader(resp.Body)
	for seen := 0; seen < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d of %d content chunks: %v", seen, n, err)
		}
		if strings.Contains(line, `"content":"tok`) {
			seen++
		}
	}
	return br
}

// runsToItsEnd reads the rest of a stream and fails unless it ended with [DONE], not stopped
// as superseded.
func runsToItsEnd(t *testing.T, br *bufio.Reader) {
	t.Helper()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rest), "superseded") || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the running answer did not run to its end: ...%s", rest[max(0, len(rest)-300):])
	}
}

// TestOneCallRunIsNotSettledOnRequest: the gateway's own run id of a call in progress cannot
// be settled by POST /v1/runs/{id}/settle — that would charge the call the nothing it had
// tallied so far — and the call is charged its usage when it ends.
func TestOneCallRunIsNotSettledOnRequest(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	// The call stays mid-stream until the settle is answered (gateUpstream's held stream).
	resp := h.post(key, "/v1/chat/completions", streamBody, with(slowStream(30, nil), "X-Test-Hold-Stream", "call"))
	var opened sync.Once
	openCall := func() { opened.Do(func() { gate.open("call") }) }
	defer openCall()
	runID := resp.Header.Get(proxy.RunIDHeader)
	br := firstEvent(t, resp)

	if status, body := h.settleRun(key, runID); status != http.StatusConflict || errorCode(t, body) != "run_in_progress" {
		t.Fatalf("settle of a call in progress: %d %s, want 409 run_in_progress", status, body)
	}
	openCall()
	readAll(t, br)
	resp.Body.Close()
	run := h.run(u.ID, runID)
	if want := fakeGPTCost(run.InTok, run.OutTok); run.OutTok != 30 || run.ChargedMicro != want || run.SettleSource.String != holds.SourceComplete {
		t.Fatalf("run %+v: want 30 output tokens charged %d on completion", run, want)
	}
	// Settled, the same request is an answer, not a charge.
	if status, body := h.settleRun(key, runID); status != http.StatusOK {
		t.Fatalf("settle of a settled call: %d %s, want 200", status, body)
	}
	if b, err := testenv.BalanceAllDays(context.Background(), h.store, u.ID); err != nil || b.UsedTodayMicro != run.ChargedMicro {
		t.Fatalf("balance %+v, %v: want used today = the one charge %d", b, err, run.ChargedMicro)
	}
}

// TestNamedRunIsNotSettledUnderARunningCall: a named run cannot be settled while one of its
// calls runs (its usage is not in the tally yet); once the call has ended, settling charges
// every call.
func TestNamedRunIsNotSettledUnderARunningCall(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-busy"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "10"))
	readAll(t, first.Body)
	first.Body.Close()

	// The call stays mid-stream until the settle is answered (paced alone, it ends in 600 ms).
	hdr, letGo := heldMidStream(t, gate, "call", slowStream(30, run))
	resp := h.post(key, "/v1/chat/completions", streamBody, hdr)
	br := firstEvent(t, resp)
	if status, body := h.settleRun(key, "task-busy"); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle under a running call: %d %s, want 409 run_busy", status, body)
	}
	letGo()
	readAll(t, br)
	resp.Body.Close()

	if status, body := h.settleRun(key, "task-busy"); status != http.StatusOK {
		t.Fatalf("settle after the calls: %d %s", status, body)
	}
	r := h.run(u.ID, first.Header.Get(proxy.RunIDHeader))
	if r.Calls != 2 || r.OutTok != 40 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) || r.SettleSource.String != holds.SourceClient {
		t.Fatalf("settled run %+v: want both calls (40 output tokens) charged", r)
	}
	// No call of a settled run starts.
	late := h.post(key, "/v1/chat/completions", chatBody, run)
	body := readAll(t, late.Body)
	late.Body.Close()
	if late.StatusCode != http.StatusConflict || errorCode(t, body) != "run_settled" {
		t.Fatalf("call on the settled run: %d %s, want 409 run_settled", late.StatusCode, body)
	}
}

// TestNamedRunConcurrentCallsShareItsCap: calls of one run that run at once share its cap.
// Each reserves its worst case before it is forwarded, so what they may cost together never
// passes the cap — checking each against the tally alone let every one of them spend all of it
// (the provider's work paid for once, at the cap).
func TestNamedRunConcurrentCallsShareItsCap(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	// 30 credits: the run's cap is 30 000 µUSD. A call asking for 1 000 output tokens may cost
	// ~10 000 (10 µUSD a token), so about three fit at once, not eight.
	allowance := int64(30_000)
	inFlight := 8 // every call may run at once: the budget, not the in-flight limit, refuses
	if err := h.store.SetUserLimits(context.Background(), u.ID, &allowance, &inFlight, nil); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"fake-gpt","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"work in parallel"}]}`
	hdr := map[string]string{"X-Run-Id": "task-parallel", fakellm.HeaderChunks: "1000", fakellm.HeaderChunkInterval: "1ms"}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[string]int{}
		runID    string
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post(key, "/v1/chat/completions", body, hdr)
			b := readAll(t, resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case resp.StatusCode == http.StatusOK:
				statuses["ok"]++
				runID = resp.Header.Get(proxy.RunIDHeader)
			case resp.StatusCode == http.StatusPaymentRequired && strings.Contains(string(b), "run_budget_exhausted"):
				statuses["run_budget_exhausted"]++
			default:
				t.Errorf("call: %d %s", resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	if statuses["ok"] == 0 || statuses["run_budget_exhausted"] == 0 {
		t.Fatalf("answers %v: want some calls run and some refused for the run's budget", statuses)
	}
	if status, body := h.settleRun(key, "task-parallel"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, runID)
	if r.CostMicro > r.CapMicro || r.CapMicro != allowance || r.ChargedMicro != r.CostMicro {
		t.Fatalf("run %+v after %v: its calls cost %d together, over the cap %d", r, statuses, r.CostMicro, r.CapMicro)
	}
}

// TestNamedRunWithoutATallyIsChargedItsHold: every call of a run leaves a tally, so a run
// settled on request with none, older than any call can be, has lost its evidence (a process
// died mid-call, a tally write failed). It is charged what it held, as the reconciler would —
// the hold itself, not the hold as a cost to discount — and not the nothing a missing tally
// reads as. A younger run may have a first call between its admission and its reservation:
// that is busy, not settled.
func TestNamedRunWithoutATallyIsChargedItsHold(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	discount := 5000
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, nil, &discount); err != nil {
		t.Fatal(err)
	}
	runID := h.endedRunCall(t, key, "task-lost")
	if err := h.rdb.Del(context.Background(), h.keys.Usage(runID)).Err(); err != nil {
		t.Fatal(err)
	}
	// Nor did the call's record on the run's row land (its process died first).
	if _, err := h.db.Exec(`UPDATE run_holds SET calls = 0, cost_micro = 0, in_tok = 0, cache_read_tok = 0,
		cache_write_tok = 0, out_tok = 0, ended_calls = 0 WHERE run_id = ?`, runID); err != nil {
		t.Fatal(err)
	}
	if status, body := h.settleRun(key, "task-lost"); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle of a young run without a tally: %d %s, want 409 run_busy", status, body)
	}
	if _, err := h.db.Exec("UPDATE run_holds SET created_at = created_at - INTERVAL 1 DAY WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	status, body := h.settleRun(key, "task-lost")
	r := h.run(u.ID, runID)
	if status != http.StatusOK || r.ChargedMicro != r.HeldMicro || r.HeldMicro == 0 || !r.Estimated {
		t.Fatalf("settle %d %s, run %+v: want charged what it held, in full, estimated", status, body, r)
	}
}

// TestNamedRunWithAnImpossibleTallyIsChargedWhatItsRowRecorded: a run's tally is Redis's word;
// a negative figure in it (a hand edit, a correction whose tally was lost) is no record of what
// the run used. Settled on request it was trusted, its negative count settled as 0 tokens where
// the run's row recorded the call's. As the reconciler does, the run is settled as one without
// a tally: charged what its row recorded of its calls.
func TestNamedRunWithAnImpossibleTallyIsChargedWhatItsRowRecorded(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := h.endedRunCall(t, key, "task-negative")
	recorded := h.run(u.ID, runID)
	if recorded.CostMicro <= 0 || recorded.Calls != 1 {
		t.Fatalf("the call's record on the run's row: cost %d, %d calls; want its cost, 1 call", recorded.CostMicro, recorded.Calls)
	}
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "in_tok", -5).Err(); err != nil {
		t.Fatal(err)
	}
	status, body := h.settleRun(key, "task-negative")
	r := h.run(u.ID, runID)
	if status != http.StatusOK || r.State != holds.StateSettled || r.CostMicro != recorded.CostMicro ||
		r.InTok != recorded.InTok || r.OutTok != recorded.OutTok || r.SettleSource.String != holds.SourceClient {
		t.Fatalf("settle %d %s, run %+v: want settled on request at the row's record, cost %d", status, body, r, recorded.CostMicro)
	}
}

// TestNamedRunWhoseRowRecordIsImpossibleIsChargedItsHold: with no tally to believe, a run
// settled on request is charged what its row recorded of its calls. No code path writes a
// negative cost there, but a hand edit can, and it went to the store, which panics on a
// negative cost: the caller's connection was dropped, and the run stayed closed until its mark
// lapsed. A row record that cannot be one (TallyBelievable) counts as none, as the
// reconciler's does: the run is charged what it held.
func TestNamedRunWhoseRowRecordIsImpossibleIsChargedItsHold(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	runID := h.endedRunCall(t, key, "task-negative-row")
	if err := h.rdb.HSet(context.Background(), h.keys.Usage(runID), "in_tok", -5).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Exec("UPDATE run_holds SET cost_micro = -500 WHERE run_id = ?", runID); err != nil {
		t.Fatal(err)
	}
	status, body := h.settleRun(key, "task-negative-row")
	r := h.run(u.ID, runID)
	if status != http.StatusOK || r.State != holds.StateSettled || r.ChargedMicro != r.HeldMicro || r.CostMicro < 0 {
		t.Fatalf("settle %d %s, run %+v: want settled on request at its hold %d", status, body, r, r.HeldMicro)
	}
}

// TestNamedRunCallIsTalliedBeforeItsAnswerEnds: a caller that settles its run the moment an
// answer ends must find that call in the run's tally. So the stream's final event ([DONE])
// reaches the caller only once the call is tallied — here the upstream lingers after its last
// event, and the tally is read the instant [DONE] arrives — and a settle sent then, on a new
// connection, charges the call instead of answering 409 run_busy.
func TestNamedRunCallIsTalliedBeforeItsAnswerEnds(t *testing.T) {
	h, lossy := newLossyHarness(t)
	u, key := h.user("standard")
	// The run's expiry push, the last database step of the call's end, answers late: what
	// the call still held then (its lease) it holds while the caller settles.
	lossy.Arm("UPDATE run_holds SET expires_at = GREATEST(expires_at, NOW(6)", testenv.LateReply)
	hdr := map[string]string{"X-Run-Id": "task-quick", fakellm.HeaderChunks: "12", fakellm.HeaderChunkInterval: "20ms",
		fakellm.HeaderLinger: "300ms"}
	// A leased run cannot be settled, so the lease must be gone with the answer's end too.
	runID, br := leasedStream(t, h, key, hdr)
	toDone(t, br)
	tallied, found, err := h.tally.Get(context.Background(), runID)
	if err != nil || !found || tallied.Calls != 1 || tallied.Usage.Output != 12 {
		t.Fatalf("tally when [DONE] arrived: %+v found=%v err=%v; want the call's 12 output tokens", tallied, found, err)
	}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodPost, h.gw.URL+"/v1/runs/task-quick/settle", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	settle, err := fresh.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, settle.Body)
	settle.Body.Close()
	if settle.StatusCode != http.StatusOK {
		t.Fatalf("settle the moment the answer ended: %d %s, want 200", settle.StatusCode, body)
	}
	readAll(t, br)
	r := h.run(u.ID, runID)
	if r.Calls != 1 || r.OutTok != 12 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) {
		t.Fatalf("run %+v: want the call charged", r)
	}
	if !lossy.Fired() {
		t.Fatal("the call's expiry push never went out")
	}
}

// TestNamedRunSettledAsItsCallEndsFindsNoLease: a named run's streamed call gives its lease
// back with its tally, before its answer's end ([DONE]) goes out, not only when the call ends
// after it: a run leased cannot be closed (CloseRun), and a caller that settles its run the
// moment it has the answer was refused 409 run_busy for a call that was over. The call's end
// is held here until the settle is answered.
func TestNamedRunSettledAsItsCallEndsFindsNoLease(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	ending, resume := h.holdAtFirst("run call end")
	runID, br := leasedStream(t, h, key, map[string]string{"X-Run-Id": "task-ending",
		fakellm.HeaderChunks: "50", fakellm.HeaderChunkInterval: "20ms"})
	toDone(t, br)
	<-ending
	status, body := h.settleRun(key, "task-ending")
	resume()
	if status != http.StatusOK {
		t.Fatalf("settle once the answer had ended, its call's end still to come: %d %s, want 200", status, body)
	}
	readAll(t, br)
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Calls != 1 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) {
		t.Fatalf("run %+v: want it settled, its call charged", r)
	}
}

// leasedStream posts a streamed call of a named run (hdr names it, and paces its chunks so
// that it outlasts its first event by far), reads its first event, and has a heartbeat write
// the call's lease, as one does for every call in flight. It returns the run's id and the
// answer's reader; the body is closed at cleanup.
func leasedStream(t *testing.T, h *harness, key string, hdr map[string]string) (string, *bufio.Reader) {
	t.Helper()
	resp := h.post(key, "/v1/chat/completions", streamBody, hdr)
	t.Cleanup(func() { resp.Body.Close() })
	runID := resp.Header.Get(proxy.RunIDHeader)
	br := firstEvent(t, resp)
	if err := h.leases.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err := h.rdb.Exists(context.Background(), h.keys.Lease(runID)).Result(); err != nil || n != 1 {
		t.Fatalf("lease of the running call: exists=%d, %v", n, err)
	}
	return runID, br
}

// TestNamedRunOutlivesAFailedFirstCall: the first call of a run fails upstream (a 503); the
// agent retries under the same name and the run goes on — not 409 run_settled — and settling
// charges only what was used.
func TestNamedRunOutlivesAFailedFirstCall(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-retry"}
	first := h.post(key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderStatus, "503"))
	readAll(t, first.Body)
	first.Body.Close()
	if first.StatusCode != http.StatusBadGateway {
		t.Fatalf("first call, upstream 503: %d, want 502", first.StatusCode)
	}
	retry, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "7")) // retry under the same run
	if status, body := h.settleRun(key, "task-retry"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	r := h.run(u.ID, retry.Header.Get(proxy.RunIDHeader))
	if r.Calls != 1 || r.OutTok != 7 || r.ChargedMicro != fakeGPTCost(r.InTok, 7) {
		t.Fatalf("run %+v: want the one call that ran charged", r)
	}
}

// TestRunCallHoldsABoundedTailAfterItsFinalEvent: a named run's call holds back what follows
// its final event until the upstream ends (see relayStream), so that it is tallied first. An
// upstream that keeps sending after [DONE] must not make that held tail grow without limit:
// past limits.max_event_bytes the upstream is cut and the call ends as complete.
func TestRunCallHoldsABoundedTailAfterItsFinalEvent(t *testing.T) {
	const flood = 16 << 20
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"total_tokens\":11}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
		event := []byte("data: {\"junk\":\"" + strings.Repeat("x", 4096) + "\"}\n\n")
		for sent := 0; sent < flood; sent += len(event) {
			if _, err := w.Write(event); err != nil {
				return // cut by the gateway
			}
		}
	}))
	defer upstream.Close()
	const maxEvent = 256 << 10
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "flood", Kind: "openai", BaseURL: upstream.URL, Models: []string{"*"}}}
		c.Limits.MaxEventBytes = maxEvent
		c.Limits.MaxBodyBytes = maxEvent / 2
	})
	u, key := h.user("standard")
	resp, got := h.postOK(t, key, "/v1/chat/completions", streamBody, map[string]string{"X-Run-Id": "flooded"})
	_, tail, found := strings.Cut(string(got), "data: [DONE]\n\n")
	if !found {
		t.Fatalf("no [DONE] in %d bytes", len(got))
	}
	if len(tail) > 2*maxEvent {
		t.Fatalf("the call held and sent %d bytes after its final event, want at most %d", len(tail), 2*maxEvent)
	}
	if status, body := h.settleRun(key, "flooded"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if run.InTok != 10 || run.OutTok != 1 {
		t.Fatalf("run charged in=%d out=%d, want the reported 10 and 1", run.InTok, run.OutTok)
	}
}

// TestNamedRunIsFoundByTheIDTheGatewayReturned: a named run's calls carry the gateway's id of
// the run in X-Tollgate-Run-Id; GET and settle by that id find the run, as by its name. A name
// shaped like a gateway id is refused, or it would be taken for one; so are . and .., which a
// URL path (GET /v1/runs/{id}, its settle) cannot name: clients drop dot segments.
func TestNamedRunIsFoundByTheIDTheGatewayReturned(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "by-id"})
	readAll(t, resp.Body)
	resp.Body.Close()
	id := resp.Header.Get(proxy.RunIDHeader)
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("call: %d, run id %q", resp.StatusCode, id)
	}
	req, _ := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/runs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	got, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, got.Body)
	got.Body.Close()
	if got.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/runs/%s: %d %s", id, got.StatusCode, body)
	}
	if status, body := h.settleRun(key, id); status != http.StatusOK {
		t.Fatalf("settle by the returned id: %d %s", status, body)
	}
	if r := h.run(u.ID, id); r.State != holds.StateSettled || r.Calls != 1 {
		t.Fatalf("run %+v, want settled with its call", r)
	}
	for _, name := range []string{"r_" + strings.Repeat("a", 32), "x_" + strings.Repeat("0", 40), ".", ".."} {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name})
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != "invalid_run_id" {
			t.Errorf("X-Run-Id %s: %d %s, want 400 invalid_run_id", name, resp.StatusCode, body)
		}
	}
}

// endedRunCall makes one whole chat call under the named run name and waits until it is over —
// answered, tallied, recorded on the run's row — and returns the run's id.
func (h *harness) endedRunCall(t *testing.T, key, name string) string {
	t.Helper()
	resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": name})
	readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	return resp.Header.Get(proxy.RunIDHeader)
}
