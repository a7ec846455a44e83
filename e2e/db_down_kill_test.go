package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
)

// TestGatewayKilledWhileDatabaseDown: a gateway is SIGKILLed while MariaDB is down, so that
// everything it had queued in memory for the database is lost with it — the settlements of
// calls it had answered (retrying until the database came back), the release of an admission
// whose COMMIT reply was lost (the tripwire) — and only another process's reconciler, once the
// database is back, settles what it left. Each round (one with a plain call's lost admission,
// one with an Idempotency-Key call's) checks, against DESIGN §5 and README:
//
//  1. plain calls answered 200 while the database was down (their settlement waiting for it)
//     are settled from their tally at what they cost, once;
//  2. streams answered whole meanwhile likewise; streams cut by the kill, charged what their
//     tally says, or their hold where the kill left none (§5 rule 3b), once;
//  3. the call refused 503 billing_unavailable because its admission's COMMIT reply was lost,
//     its gateway killed before its release could run: its committed hold is charged 0 (a
//     plain call's by its zero tally; an Idempotency-Key attempt's, which has none, by the
//     mark its refusal left) and the key's retry runs and is charged once;
//  4. named runs with a call in flight at the kill: settled from the calls that ended (tally),
//     at their hold when none did; one whose only call ended while the database was down, at
//     that call's cost.
//
// The upstream holds the calls of (1), (2) and (4) that must end during the outage until the
// database is dead (a gate, not a sleep), so each is admitted before and answered after.
func TestGatewayKilledWhileDatabaseDown(t *testing.T) {
	m := startPrivateMariaDB(t)
	m.migrate()
	w := newWorldAt(t, m.dsn())
	up := newGatedUpstream(t)
	w.upstream = up.srv
	// Admissions give up after 3 s, so the lost one is refused while the server is down (the
	// test waits for that refusal before restarting it); the calls admitted before the outage,
	// a dozen on a database that syncs every commit, have that long to be granted (at 1 s, a
	// loaded machine's descheduled batch or slow fsync refused one, and the test failed).
	// Settlements keep retrying (a minute) far past the kill of their gateway, which comes once
	// the answered calls are tallied (bounded at 10 s): every settlement is still waiting then.
	w.config = w.writeConfig(map[string]string{"limits.admit_timeout": "3s", "limits.settle_timeout": "60s"})
	trip := newTripwire(t, fmt.Sprintf("127.0.0.1:%d", m.port))
	for _, kind := range []string{"plain", "idempotent"} {
		downKillRound(t, w, m, trip, up, kind)
	}
	if bad, err := holds.Audit(context.Background(), w.db); err != nil || len(bad) > 0 {
		t.Errorf("audit after the rounds: %v %+v", err, bad)
	}
}

// gatedUpstream is the fake upstream behind a gate: a request with X-Fake-Gate is announced on
// arrived and held until the gate opens (or its caller leaves).
type gatedUpstream struct {
	srv     *httptest.Server
	arrived chan string
	mu      sync.Mutex
	gate    chan struct{}
}

func newGatedUpstream(t *testing.T) *gatedUpstream {
	fake := fakellm.New(fakellm.Config{})
	g := &gatedUpstream{arrived: make(chan string, 64), gate: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get("X-Fake-Gate"); name != "" {
			r.Header.Del("X-Fake-Gate")
			g.mu.Lock()
			gate := g.gate
			g.mu.Unlock()
			g.arrived <- name
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		fake.ServeHTTP(rw, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// close opens the gate and sets a closed one for the next round.
func (g *gatedUpstream) open() {
	g.mu.Lock()
	close(g.gate)
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

// awaitArrivals waits (bounded) until n gated requests have arrived.
func (g *gatedUpstream) awaitArrivals(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.arrived:
		case <-time.After(20 * time.Second):
			t.Fatalf("gated upstream: fewer than %d requests arrived within 20s", n)
		}
	}
}

// downCall is how a call ended for its caller.
type downCall struct {
	status   int
	code     string
	runID    string
	complete bool
	usage    pricing.Usage
	err      error
}

// sendSeen sends a chat completion (streamed or not) and reads its answer whole: a stream is
// complete with its [DONE] and usage event, a JSON answer with its usage.
func sendSeen(g *gateway, key string, stream bool, content string, hdr map[string]string) <-chan downCall {
	out := make(chan downCall, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		resp, err := do(ctx, g, key, chatRequest(stream, 40, content), hdr)
		if err != nil {
			out <- downCall{err: err}
			return
		}
		defer resp.Body.Close()
		s := downCall{status: resp.StatusCode, runID: resp.Header.Get(RunIDHeaderForTests)}
		type usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		}
		var body struct {
			Usage *usage `json:"usage"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if !stream || resp.StatusCode != http.StatusOK {
			s.err = json.NewDecoder(resp.Body).Decode(&body)
			s.code = body.Error.Code
			if resp.StatusCode == http.StatusOK && body.Usage != nil {
				s.complete, s.usage = true, pricing.Usage{Input: body.Usage.Prompt, Output: body.Usage.Completion}
			}
			out <- s
			return
		}
		sc := bufio.NewScanner(resp.Body)
		var u *usage
		done := false
		for sc.Scan() {
			line := sc.Text()
			if line == "data: [DONE]" {
				done = true
				continue
			}
			if ev, ok := strings.CutPrefix(line, "data: "); ok {
				var e struct {
					Usage *usage `json:"usage"`
				}
				if json.Unmarshal([]byte(ev), &e) == nil && e.Usage != nil {
					u = e.Usage
				}
			}
		}
		s.err = sc.Err()
		if done && u != nil {
			s.complete, s.usage = true, pricing.Usage{Input: u.Prompt, Output: u.Completion}
		}
		out <- s
	}()
	return out
}

// receive waits (bounded) for a call's end.
func receive(t *testing.T, ch <-chan downCall, what string) downCall {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no answer within 60s", what)
		return downCall{}
	}
}

// downKillRound is one round of TestGatewayKilledWhileDatabaseDown; kind is the lost
// admission's call: "plain" or "idempotent".
func downKillRound(t *testing.T, w *world, m *privateMariaDB, trip *tripwire, up *gatedUpstream, kind string) {
	u, key := w.user("down-"+kind, 30, nil)
	lostUser, lostKey := w.user("down-lost-"+kind, 30, nil)
	victim := w.startGatewayWith("gw-victim-"+kind, w.config, "MYSQL_DSN="+m.dsnAt(trip.addr()))
	gated := func(name string, extra map[string]string) map[string]string {
		h := map[string]string{"X-Fake-Gate": name, "X-Fake-Chunks": "25"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}

	// Admitted while the database is up, answered once it is down.
	var plains, streams []<-chan downCall
	for i := range 3 {
		plains = append(plains, sendSeen(victim, key, false, fmt.Sprintf("%s plain %d", kind, i), gated("plain", nil)))
	}
	for i := range 2 {
		streams = append(streams, sendSeen(victim, key, true, fmt.Sprintf("%s stream %d", kind, i),
			gated("stream", map[string]string{"X-Fake-Chunk-Interval": "2ms"})))
	}
	runEnded := sendSeen(victim, key, false, kind+" run-ended step 0", gated("run", map[string]string{"X-Run-Id": kind + "-run-ended"}))
	// Cut by the kill: two streams of their own, a named run's second call (its first answered
	// before the outage) and a named run's only call.
	long := map[string]string{}
	cut := []*stream{startStream(t, victim, key, 5000, 20*time.Millisecond, long), startStream(t, victim, key, 5000, 20*time.Millisecond, long)}
	midID, midUsage := completeCall(t, victim, key, chatBody(false, 45, kind+" run-mid step 0"),
		map[string]string{"X-Run-Id": kind + "-run-mid", "X-Fake-Chunks": "30"})
	mid := startStream(t, victim, key, 5000, 20*time.Millisecond, map[string]string{"X-Run-Id": kind + "-run-mid"})
	only := startStream(t, victim, key, 5000, 20*time.Millisecond, map[string]string{"X-Run-Id": kind + "-run-only"})
	waitFor(t, 10*time.Second, "the run-mid step 0 tally", func() bool {
		tl, found, err := w.tally.Get(context.Background(), midID)
		return err == nil && found && tl.Calls == 1
	})
	up.awaitArrivals(t, len(plains)+len(streams)+1)

	// The lost admission: its COMMIT goes out, its reply is muted, the server dies.
	idemKey := "down-kill-" + kind
	var lost <-chan downCall
	var fired <-chan struct{}
	switch kind {
	case "plain":
		fired = trip.arm(fmt.Sprintf(", %d, NULLIF('', ''), NULLIF('', '')", lostUser.ID), "COMMIT")
		lost = sendSeen(victim, lostKey, false, "lost plain", map[string]string{"X-Fake-Chunks": "5"})
	case "idempotent":
		fired = trip.arm("'"+testIdemRunID(lostUser.ID, idemKey, 0)+"'", "COMMIT")
		lost = sendSeen(victim, lostKey, false, "lost idempotent", map[string]string{"X-Fake-Chunks": "5", "Idempotency-Key": idemKey})
	}
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the lost admission's COMMIT did not go out within 20s", kind)
	}
	awaitAnswer(t, trip, w.db, kind+": the lost admission's COMMIT")
	m.kill()

	// While the server is down: the gated calls are answered whole, the lost one refused.
	up.open()
	answered := map[string]pricing.Usage{}
	label := map[string]string{}
	for i, ch := range append(append(plains, streams...), runEnded) {
		what := fmt.Sprintf("%s plain call %d", kind, i)
		switch {
		case i >= len(plains)+len(streams):
			what = kind + " named run whose only call ended during the outage"
		case i >= len(plains):
			what = fmt.Sprintf("%s stream %d", kind, i-len(plains))
		}
		s := receive(t, ch, what)
		if s.status != http.StatusOK || !s.complete {
			t.Fatalf("%s: %d %s complete=%v (%v)", what, s.status, s.code, s.complete, s.err)
		}
		answered[s.runID], label[s.runID] = s.usage, what+", answered during the outage,"
	}
	if s := receive(t, lost, kind+" lost admission"); s.status != http.StatusServiceUnavailable || s.code != "billing_unavailable" {
		t.Fatalf("%s lost admission: answered %d %s, want 503 billing_unavailable", kind, s.status, s.code)
	}
	// A call's tally is written as its answer ends, beside its settlement: wait for it, so
	// that the kill finds each answered call tallied and its settlement still waiting.
	tallied := func() bool {
		for id := range answered {
			if _, found, err := w.tally.Get(context.Background(), id); err != nil || !found {
				return false
			}
		}
		return true
	}
	waitFor(t, 10*time.Second, kind+": the calls answered during the outage to be tallied", tallied)
	victim.signal(t, syscall.SIGKILL)
	for _, s := range append(cut, mid, only) {
		<-s.done
	}
	m.restart()
	t.Logf("%s round: MariaDB SIGKILLed once it had run the lost admission's COMMIT, gateway SIGKILLed during the outage, MariaDB restarted", kind)

	// Another process's reconciler settles everything the victim left.
	peer := w.startGateway("gw-peer-" + kind)
	waitFor(t, 60*time.Second, kind+": every hold to be settled by the peer", func() bool { return w.liveHolds() == 0 })

	check := func(what, id, source string, charged int64) {
		t.Helper()
		r := w.hold(id)
		if r.State != holds.StateSettled || r.SettleSource.String != source || r.ChargedMicro != charged {
			t.Errorf("%s %s: %s by %q charged %d, want settled by %s charged %d (held %d)",
				what, id, r.State, r.SettleSource.String, r.ChargedMicro, source, charged, r.HeldMicro)
		}
	}
	// 1, 2 and 4: the answered calls at what they cost, from their tally.
	for id, use := range answered {
		tl, _, err := w.tally.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if cost := w.price.Cost(use); tl.CostMicro != cost {
			t.Errorf("%s %s: tally cost %d, its answer's usage costs %d", label[id], id, tl.CostMicro, cost)
		}
		check(label[id], id, holds.SourceReconcile, w.price.Cost(use))
	}
	// 2: streams cut by the kill: their tally if the kill left one, else their hold.
	for _, s := range cut {
		tl, found, err := w.tally.Get(context.Background(), s.runID)
		if err != nil {
			t.Fatal(err)
		}
		if found {
			check(kind+" stream cut by the kill", s.runID, holds.SourceReconcile, tl.CostMicro)
		} else {
			check(kind+" stream cut by the kill", s.runID, holds.SourceReconcileHold, w.hold(s.runID).HeldMicro)
		}
	}
	// 4: a named run with a call in flight at the kill: from the call that ended before it;
	// one whose only call was in flight, at its hold.
	check(kind+" named run cut mid-call", midID, holds.SourceReconcile, w.price.Cost(midUsage))
	check(kind+" named run cut in its only call", only.runID, holds.SourceReconcileHold, w.hold(only.runID).HeldMicro)
	// 3: the refused call's committed hold, charged nothing.
	var lostRows []holds.Run
	if err := w.db.Select(&lostRows, "SELECT run_id, state, charged_micro, held_micro, settle_source FROM run_holds WHERE user_id = ?", lostUser.ID); err != nil {
		t.Fatal(err)
	}
	if len(lostRows) != 1 {
		t.Fatalf("%s: the lost admission left %d holds, want its committed one: %+v", kind, len(lostRows), lostRows)
	}
	if r := lostRows[0]; r.State != holds.StateSettled || r.ChargedMicro != 0 {
		t.Errorf("%s lost admission %s, refused 503, its gateway killed during the outage: %s by %q charged %d (held %d), want 0",
			kind, r.RunID, r.State, r.SettleSource.String, r.ChargedMicro, r.HeldMicro)
	}
	if kind == "idempotent" {
		// The key's retry runs (the refused attempt pinned nothing) and is charged once.
		s := receive(t, sendSeen(peer, lostKey, false, "lost idempotent", map[string]string{"X-Fake-Chunks": "5", "Idempotency-Key": idemKey}), "the key's retry")
		if s.status != http.StatusOK || !s.complete || s.runID != testIdemRunID(lostUser.ID, idemKey, 1) {
			t.Fatalf("the key's retry: %d %s complete=%v run %s, want 200 as attempt 1", s.status, s.code, s.complete, s.runID)
		}
		waitFor(t, 20*time.Second, "the retry to settle", func() bool { return w.liveHolds() == 0 })
		check("the key's retry", s.runID, holds.SourceComplete, w.price.Cost(s.usage))
	}
	// Once: each user's day is the sum of its charges.
	for _, uid := range []uint64{u.ID, lostUser.ID} {
		var sum int64
		if err := w.db.Get(&sum, "SELECT COALESCE(SUM(charged_micro), 0) FROM run_holds WHERE user_id = ?", uid); err != nil {
			t.Fatal(err)
		}
		if got := w.ledgerUsed(uid); got != sum {
			t.Errorf("%s: user %d's day ledger %d, its holds charged %d", kind, uid, got, sum)
		}
	}
	stopGateway(t, peer)
}
