package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// Two gateway processes share one database and one Redis (README: Scaling out): what one
// process admitted, the other must see, whichever of them a load balancer picks.

// postAt posts to the gateway at url and returns the open response.
func postAt(t *testing.T, url, key, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// settleAt posts a run's settle to the gateway at url.
func settleAt(t *testing.T, url, key, id string) (int, []byte) {
	t.Helper()
	resp := postAt(t, url, key, "/v1/runs/"+id+"/settle", "", nil)
	defer resp.Body.Close()
	return resp.StatusCode, readAll(t, resp.Body)
}

// TestNamedRunSettledOnAnotherGatewayWaitsForItsCallAndChargesEveryCall: a run whose call
// streams on one process is busy to a settle sent to the other; once the call has ended, that
// settle charges the calls of both processes.
func TestNamedRunSettledOnAnotherGatewayWaitsForItsCallAndChargesEveryCall(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	_, other := h.secondGateway(nil, nil)
	run := map[string]string{"X-Run-Id": "task-two-gateways"}
	first := postAt(t, other, key, "/v1/chat/completions", chatBody, with(run, fakellm.HeaderChunks, "10"))
	readAll(t, first.Body)
	first.Body.Close()

	// The call stays mid-stream until the settle is answered (paced alone, it ends in 600 ms).
	hdr, letGo := heldMidStream(t, gate, "call", slowStream(30, run))
	resp := h.post(key, "/v1/chat/completions", streamBody, hdr)
	br := firstEvent(t, resp)
	if status, body := settleAt(t, other, key, "task-two-gateways"); status != http.StatusConflict || errorCode(t, body) != "run_busy" {
		t.Fatalf("settle on the other gateway under a running call: %d %s, want 409 run_busy", status, body)
	}
	letGo()
	readAll(t, br)
	resp.Body.Close()
	if status, body := settleAt(t, other, key, "task-two-gateways"); status != http.StatusOK {
		t.Fatalf("settle after the call: %d %s", status, body)
	}
	r := h.run(u.ID, first.Header.Get(proxy.RunIDHeader))
	if r.Calls != 2 || r.OutTok != 40 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) || r.SettleSource.String != holds.SourceClient {
		t.Fatalf("settled run %+v: want both gateways' calls (40 output tokens) charged", r)
	}
}

// TestNamedRunCallsInFlightAreBoundedAcrossGateways: a run's in-flight bound (the user's
// max_in_flight) counts its calls on every process, not per process.
func TestNamedRunCallsInFlightAreBoundedAcrossGateways(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	one := 1
	if err := h.store.SetUserLimits(context.Background(), u.ID, nil, &one, nil); err != nil {
		t.Fatal(err)
	}
	_, other := h.secondGateway(nil, nil)
	run := map[string]string{"X-Run-Id": "task-one-at-a-time"}
	// The call stays mid-stream until the second is answered (paced alone, it ends in 600 ms).
	hdr, letGo := heldMidStream(t, gate, "call", slowStream(30, run))
	resp := h.post(key, "/v1/chat/completions", streamBody, hdr)
	br := firstEvent(t, resp)
	a := send(other, key, chatBody, run)
	if a.err != nil || a.status != http.StatusTooManyRequests || errorCode(t, a.body) != "too_many_in_flight" {
		t.Errorf("second call of the run on the other gateway: %d %s %v, want 429 too_many_in_flight", a.status, a.body, a.err)
	}
	letGo()
	readAll(t, br)
	resp.Body.Close()
	if status, body := settleAt(t, other, key, "task-one-at-a-time"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.Calls != 1 || r.OutTok != 30 {
		t.Fatalf("settled run %+v: want the one call that ran", r)
	}
}

// TestIdempotentRetryOnAnotherGatewayWaitsThenReplaysAndChargesOnce: a retry under the same
// Idempotency-Key that reaches the other process while the first attempt streams is told it is
// in progress; after it ended, the other process replays its answer; one run is charged.
func TestIdempotentRetryOnAnotherGatewayWaitsThenReplaysAndChargesOnce(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	_, other := h.secondGateway(nil, nil)
	idem := map[string]string{"Idempotency-Key": "retry-on-another-replica"}
	// The first attempt stays mid-stream until the retry is answered (gateUpstream's held
	// stream): paced alone, its 30 events end in 600 ms whether or not they are read.
	resp := h.post(key, "/v1/chat/completions", streamBody, with(slowStream(30, idem), "X-Test-Hold-Stream", "first"))
	var opened sync.Once
	openFirst := func() { opened.Do(func() { gate.open("first") }) }
	defer openFirst()
	br := firstEvent(t, resp)
	if a := send(other, key, streamBody, slowStream(30, idem)); a.err != nil || a.status != http.StatusConflict || errorCode(t, a.body) != "request_in_progress" {
		t.Errorf("retry while the first attempt streams: %d %s %v, want 409 request_in_progress", a.status, a.body, a.err)
	}
	openFirst()
	rest := readAll(t, br)
	resp.Body.Close()
	h.settled()
	a := send(other, key, streamBody, slowStream(30, idem))
	if a.err != nil || a.status != http.StatusOK || a.header.Get(proxy.ReplayedHeader) != "true" ||
		!strings.HasSuffix(string(a.body), string(rest)) {
		t.Fatalf("retry after the first attempt: %d replayed=%q %v, want its answer replayed", a.status, a.header.Get(proxy.ReplayedHeader), a.err)
	}
	if n := h.runCount(u.ID); n != 1 {
		t.Fatalf("%d runs, want the first attempt's alone", n)
	}
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if r.OutTok != 30 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) {
		t.Fatalf("run %+v: want its 30 output tokens charged once", r)
	}
}

// TestSessionSameMessageOnAnotherGatewayIsAlreadyRunning: the same message of a session sent
// to the other process while the first still answers is a duplicate there too.
func TestSessionSameMessageOnAnotherGatewayIsAlreadyRunning(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	_, other := h.secondGateway(nil, nil)
	sess := map[string]string{"X-Session-Id": "chat-on-two-replicas"}
	// The first stays mid-stream until the resend is answered (paced alone, it ends in 600 ms).
	hdr, letGo := heldMidStream(t, gate, "first", slowStream(30, sess))
	resp := h.post(key, "/v1/chat/completions", streamBody, hdr)
	br := firstEvent(t, resp)
	a := send(other, key, streamBody, slowStream(30, sess))
	if a.err != nil || a.status != http.StatusConflict || errorCode(t, a.body) != "already_running" {
		t.Errorf("same message on the other gateway: %d %s %v, want 409 already_running", a.status, a.body, a.err)
	}
	letGo()
	readAll(t, br)
	resp.Body.Close()
	if r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); r.OutTok != 30 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) {
		t.Fatalf("first run %+v: want it charged in full", r)
	}
	h.expectCharges(u.ID, []string{resp.Header.Get(proxy.RunIDHeader)}, holds.SourceDuplicate)
}
