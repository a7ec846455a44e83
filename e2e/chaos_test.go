package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestChaosExactlyOnce is a randomized chaos run: two gateway processes share the database
// and Redis; about twenty callers send mixed traffic to either of them (plain and streamed
// calls, streams cancelled mid-way, Idempotency-Key retries to either process, X-Run-Id runs
// whose calls alternate between the processes, users with balances small enough to get 402),
// while a chaos loop SIGKILLs a random gateway at random moments and restarts it. After the
// traffic stops every hold is settled by the operator's forced reconcile pass, and the books
// are audited:
//
//   - no hold is left live, and the day ledger is the sum of settled charges (holds.Audit);
//   - no hold is charged over its cap, and no user beyond the overdraft bound of DESIGN §3
//     (Σ cap − hold of the holds in flight when the balance ran out);
//   - a call whose caller saw its complete answer with a usage report is charged exactly its
//     price (the fake upstream's deterministic usage at fake-gpt's prices), once — unless the
//     process that served it was killed before it settled: then the reconciler's rules apply
//     (DESIGN §5: from the tally, or the hold when there is none);
//   - a named run is charged the sum of the calls its agent saw complete (exactly, when none
//     of them was cut), never more than its cap;
//   - an Idempotency-Key runs to a complete answer once; its retries replay that run.
//
// CHAOS_SEED replays a seed (the schedule of each caller and of the chaos loop; the timing
// of the processes is not replayed), CHAOS_DURATION sets how long the traffic runs (default
// 35s). CHAOS_STALL=1 also stalls Redis (CLIENT PAUSE) now and then, and, with
// CHAOS_MYSQL_PID set to the MariaDB server's pid, pauses it with SIGSTOP for up to a
// second: both are off by default because `go test ./...` runs other packages against the
// same servers at the same time.
func TestChaosExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
	}
	duration := 35 * time.Second
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		var err error
		if duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("CHAOS_DURATION: %v", err)
		}
	}
	t.Logf("chaos seed %d (replay with CHAOS_SEED=%d), traffic for %v", seed, seed, duration)

	w := newWorld(t)
	c := &chaos{w: w, t: t, seed: seed, started: w.dbNow()}
	c.setupUsers()
	for i := range c.slots {
		if err := c.slots[i].start(w, i); err != nil {
			t.Fatal(err)
		}
	}

	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var wg sync.WaitGroup
	for i := range chaosCallers {
		wg.Add(1)
		go func() { defer wg.Done(); c.caller(ctx, i) }()
	}
	chaosDone := make(chan struct{})
	go func() { defer close(chaosDone); c.chaosLoop(ctx) }()
	wg.Wait()
	<-chaosDone
	t.Logf("traffic stopped: %s", c.summary())

	// Both processes go away gracefully (a killed one is already gone); then the operator's
	// forced pass settles whatever is left once it has expired.
	for i := range c.slots {
		s := &c.slots[i]
		s.mu.Lock()
		g := s.g
		s.mu.Unlock()
		select {
		case <-g.done:
		default:
			_ = g.cmd.Process.Signal(syscall.SIGTERM)
			if err := g.wait(t, 30*time.Second); err != nil {
				t.Logf("gateway %s ended: %v", g.name, err)
			}
		}
	}
	c.reconcileAll()
	c.audit()
	// Under E2E_GATEWAY_RACE=1 a race the detector saw is in a process's log, killed or not.
	for i := range c.slots {
		for _, g := range c.slots[i].past {
			if b, err := os.ReadFile(g.log); err == nil && strings.Contains(string(b), "WARNING: DATA RACE") {
				t.Errorf("gateway %s logged a data race:\n%s", g.name, tail(b, 6000))
			}
		}
	}
}

const chaosCallers = 20

// chaosSlot is one of the two gateway processes, restarted after each kill. Each start is an
// incarnation: the calls it served are exempt from the exact-price check only if it was killed.
type chaosSlot struct {
	mu   sync.Mutex
	g    *gateway
	inc  int
	past []*gateway // every incarnation, for their logs
}

var incarnations atomic.Int64

// start runs a new incarnation of slot i (retrying, as startGatewayWith does, on a port
// taken meanwhile); safe off the test's goroutine.
func (s *chaosSlot) start(w *world, i int) error {
	inc := int(incarnations.Add(1))
	var err error
	for range 3 {
		var g *gateway
		if g, err = w.tryStart(fmt.Sprintf("gw-%d-%d", i, inc), w.config, nil); err == nil {
			s.mu.Lock()
			s.g, s.inc = g, inc
			s.past = append(s.past, g)
			s.mu.Unlock()
			return nil
		}
	}
	return fmt.Errorf("gateway slot %d did not start: %w", i, err)
}

func (s *chaosSlot) current() (*gateway, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.g, s.inc
}

type chaosUser struct {
	id        uint64
	key       string
	allowance int64
}

// callRec is what a caller saw of one HTTP call.
type callRec struct {
	kind      string // plain, stream, cancel, idem, run
	caller    int
	user      int
	inc       int // the incarnation that served it
	status    int
	runID     string
	replayed  bool
	complete  bool // the whole answer, with its usage report, reached the caller
	usage     pricing.Usage
	transport bool // no status, or the body broke off
	cancelled bool // the caller cancelled it on purpose
	key       string
	run       string // X-Run-Id
}

type chaos struct {
	w       *world
	t       *testing.T
	seed    int64
	started time.Time // database time
	users   []chaosUser
	slots   [2]chaosSlot

	mu      sync.Mutex
	calls   []callRec
	killed  map[int]time.Time // incarnation -> when it was killed
	kills   int
	stalls  int
	settles map[string]int    // named run -> status of the settle the agent sent (0: abandoned)
	last    [chaosCallers]int // caller -> status of its latest call
	early   map[int]int       // status -> settles sent while a call of the run may run
}

func (c *chaos) setupUsers() {
	c.killed = map[int]time.Time{}
	c.settles = map[string]int{}
	c.early = map[int]int{}
	r := rand.New(rand.NewPCG(uint64(c.seed), 0))
	// Two users with the plan's allowance, four whose balance runs out within seconds.
	for i := range 6 {
		var allowance *int64
		inFlight := 10
		if i >= 2 {
			a := 8_000 + r.Int64N(32_000)
			allowance, inFlight = &a, 3
		}
		u, key := c.w.user(fmt.Sprintf("chaos-%d", i), inFlight, allowance)
		cu := chaosUser{id: u.ID, key: key, allowance: 2_000_000}
		if allowance != nil {
			cu.allowance = *allowance
		}
		c.users = append(c.users, cu)
	}
}

func (c *chaos) record(r callRec) {
	c.mu.Lock()
	c.calls = append(c.calls, r)
	c.last[r.caller] = r.status
	c.mu.Unlock()
}

// chaosLoop kills a random gateway every 1.5–5 s and restarts it 0–1.5 s later.
func (c *chaos) chaosLoop(ctx context.Context) {
	r := rand.New(rand.NewPCG(uint64(c.seed), 99))
	stall := os.Getenv("CHAOS_STALL") == "1"
	mysqlPID, _ := strconv.Atoi(os.Getenv("CHAOS_MYSQL_PID"))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(1500+r.IntN(3500)) * time.Millisecond):
		}
		if stall && r.IntN(3) == 0 {
			c.stallOnce(r, mysqlPID)
			continue
		}
		i := r.IntN(len(c.slots))
		g, inc := c.slots[i].current()
		_ = g.cmd.Process.Kill()
		<-g.done
		c.mu.Lock()
		c.killed[inc] = time.Now()
		c.kills++
		c.mu.Unlock()
		time.Sleep(time.Duration(r.IntN(1500)) * time.Millisecond)
		if err := c.slots[i].start(c.w, i); err != nil {
			c.t.Error(err) // the slot stays down; its callers see refused connections
			return
		}
	}
}

// stallOnce stops Redis (every client paused) or MariaDB (SIGSTOP) for up to a second.
func (c *chaos) stallOnce(r *rand.Rand, mysqlPID int) {
	d := time.Duration(200+r.IntN(800)) * time.Millisecond
	if mysqlPID > 0 && r.IntN(2) == 0 {
		if err := syscall.Kill(mysqlPID, syscall.SIGSTOP); err == nil {
			time.Sleep(d)
			_ = syscall.Kill(mysqlPID, syscall.SIGCONT)
			c.mu.Lock()
			c.stalls++
			c.mu.Unlock()
			c.t.Logf("MariaDB stopped for %v", d)
		}
		return
	}
	if err := c.w.rdb.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err == nil {
		c.mu.Lock()
		c.stalls++
		c.mu.Unlock()
		c.t.Logf("Redis paused for %v", d)
	} else {
		c.t.Logf("Redis not paused: %v", err)
	}
}

func (c *chaos) caller(ctx context.Context, n int) {
	r := rand.New(rand.NewPCG(uint64(c.seed), uint64(n+1)))
	u := n % len(c.users)
	for i := 0; ctx.Err() == nil; i++ {
		switch p := r.IntN(100); {
		case p < 30:
			c.call(ctx, r, callRec{kind: "plain", user: u, caller: n}, c.body(r, false, n, i), nil, -1)
		case p < 55:
			c.call(ctx, r, callRec{kind: "stream", user: u, caller: n}, c.body(r, true, n, i), c.streamKnobs(r), -1)
		case p < 65:
			c.call(ctx, r, callRec{kind: "cancel", user: u, caller: n}, c.body(r, true, n, i), c.streamKnobs(r), 1+r.IntN(20))
		case p < 82:
			c.idempotent(ctx, r, u, n, i)
		default:
			c.namedRun(ctx, r, u, n, i)
		}
		pause := time.Duration(r.IntN(150)) * time.Millisecond
		if c.lastStatus(n) == http.StatusPaymentRequired {
			pause += time.Duration(500+r.IntN(1000)) * time.Millisecond // out of credits: wait
		}
		time.Sleep(pause)
	}
}

// lastStatus is the status of caller n's latest call.
func (c *chaos) lastStatus(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[n]
}

// body is a chat request of a random size; streamed ones ask for the usage report.
func (c *chaos) body(r *rand.Rand, stream bool, n, i int) []byte {
	words := make([]string, 2+r.IntN(40))
	for k := range words {
		words[k] = strconv.FormatInt(r.Int64N(1e6), 36)
	}
	m := map[string]any{"model": "fake-gpt", "stream": stream, "max_tokens": 5 + r.IntN(400),
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("caller %d call %d: %s", n, i, strings.Join(words, " "))}}}
	if stream {
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

// streamKnobs paces a stream; one in ten outlives hold_ttl (the reconciler must find its
// lease and extend it, not settle it).
func (c *chaos) streamKnobs(r *rand.Rand) map[string]string {
	if r.IntN(10) == 0 {
		return map[string]string{"X-Fake-Chunks": strconv.Itoa(200 + r.IntN(200)), "X-Fake-Chunk-Interval": fmt.Sprintf("%dms", 10+r.IntN(6))}
	}
	return map[string]string{"X-Fake-Chunks": strconv.Itoa(5 + r.IntN(150)),
		"X-Fake-Chunk-Interval": fmt.Sprintf("%dms", 2+r.IntN(12))}
}

// call sends one chat completion to a random gateway and records what the caller saw;
// cancelAfter ≥ 0 cancels a stream after that many content events.
func (c *chaos) call(ctx context.Context, r *rand.Rand, rec callRec, body []byte, hdr map[string]string, cancelAfter int) callRec {
	if hdr == nil {
		hdr = map[string]string{"X-Fake-Chunks": strconv.Itoa(5 + r.IntN(200))}
	}
	g, inc := c.slots[r.IntN(len(c.slots))].current()
	rec.inc = inc
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	resp, err := do(cctx, g, c.users[rec.user].key, body, hdr)
	if err != nil {
		rec.transport = true
		c.record(rec)
		return rec
	}
	defer resp.Body.Close()
	rec.status, rec.runID = resp.StatusCode, resp.Header.Get(RunIDHeaderForTests)
	rec.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if resp.StatusCode != http.StatusOK {
		if _, err := io.ReadAll(resp.Body); err != nil {
			rec.transport = true
		}
		c.record(rec)
		return rec
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := io.ReadAll(resp.Body)
		var out struct {
			Usage *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err != nil || json.Unmarshal(raw, &out) != nil {
			rec.transport = true
		} else if out.Usage != nil {
			rec.complete, rec.usage = true, pricing.Usage{Input: out.Usage.Prompt, Output: out.Usage.Completion}
		}
		c.record(rec)
		return rec
	}
	sc := bufio.NewScanner(resp.Body)
	var events int
	var done, sawUsage bool
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var ev struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.Usage != nil {
			sawUsage, rec.usage = true, pricing.Usage{Input: ev.Usage.Prompt, Output: ev.Usage.Completion}
		}
		if len(ev.Choices) > 0 {
			events++
			if cancelAfter >= 0 && events > cancelAfter {
				rec.cancelled = true
				cancel()
				break
			}
		}
	}
	if !rec.cancelled {
		if sc.Err() != nil || !done {
			rec.transport = true
		}
		rec.complete = done && sawUsage && sc.Err() == nil
	}
	c.record(rec)
	return rec
}

// idempotent sends one request under an Idempotency-Key, now and then a concurrent twin to
// the other gateway, then retries it once or twice to either.
func (c *chaos) idempotent(ctx context.Context, r *rand.Rand, u, n, i int) {
	key := fmt.Sprintf("idem-%d-%d-%d", c.seed, n, i)
	stream := r.IntN(2) == 0
	body := c.body(r, stream, n, i)
	hdr := map[string]string{"Idempotency-Key": key, "X-Fake-Chunks": strconv.Itoa(5 + r.IntN(150))}
	if stream {
		hdr["X-Fake-Chunk-Interval"] = fmt.Sprintf("%dms", 2+r.IntN(10))
	}
	send := func(r *rand.Rand) callRec {
		return c.call(ctx, r, callRec{kind: "idem", user: u, key: key, caller: n}, body, hdr, -1)
	}
	var wg sync.WaitGroup
	if r.IntN(3) == 0 {
		r2 := rand.New(rand.NewPCG(r.Uint64(), 7))
		wg.Add(1)
		go func() { defer wg.Done(); send(r2) }()
	}
	send(r)
	wg.Wait()
	for range 1 + r.IntN(2) {
		for try := 0; try < 5; try++ {
			rec := send(r)
			if rec.status != http.StatusConflict && !rec.transport {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}

// namedRun runs an agent task of 2–5 calls through one X-Run-Id, each to a random gateway,
// then settles it on either, or abandons it to the reconciler.
func (c *chaos) namedRun(ctx context.Context, r *rand.Rand, u, n, i int) {
	name := fmt.Sprintf("run-%d-%d-%d", c.seed, n, i)
	c.mu.Lock()
	c.settles[name] = 0
	c.mu.Unlock()
	step := func(r *rand.Rand, k int) callRec {
		hdr := map[string]string{"X-Run-Id": name}
		stream := r.IntN(2) == 0
		cancelAfter := -1
		if stream {
			for hk, hv := range c.streamKnobs(r) {
				hdr[hk] = hv
			}
			if r.IntN(7) == 0 {
				cancelAfter = 1 + r.IntN(20)
			}
		} else {
			hdr["X-Fake-Chunks"] = strconv.Itoa(5 + r.IntN(200))
		}
		return c.call(ctx, r, callRec{kind: "run", user: u, run: name, caller: n}, c.body(r, stream, n, i*10+k), hdr, cancelAfter)
	}
	for k := range 2 + r.IntN(4) {
		// Now and then the agent overlaps two calls (each to a random gateway), or sends
		// its settle while a call is still running (409 run_busy, or the call refused).
		var wg sync.WaitGroup
		switch r.IntN(6) {
		case 0:
			r2 := rand.New(rand.NewPCG(r.Uint64(), 11))
			wg.Add(1)
			go func() { defer wg.Done(); step(r2, 100+k) }()
		case 1:
			r2 := rand.New(rand.NewPCG(r.Uint64(), 13))
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(r2.IntN(300)) * time.Millisecond)
				c.settleRun(ctx, r2, u, name, false)
			}()
		}
		rec := step(r, k)
		wg.Wait()
		if rec.status == http.StatusConflict || rec.status == http.StatusPaymentRequired {
			break
		}
	}
	if r.IntN(4) == 0 {
		return // abandoned: the reconciler settles it once it expires
	}
	c.settleRun(ctx, r, u, name, true)
}

// settleRun sends POST /v1/runs/{name}/settle to a random gateway; persist retries it while
// the run is busy or the gateway unreachable.
func (c *chaos) settleRun(ctx context.Context, r *rand.Rand, u int, name string, persist bool) {
	for try := 0; try < 20; try++ {
		g, _ := c.slots[r.IntN(len(c.slots))].current()
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, g.url+"/v1/runs/"+name+"/settle", nil)
		req.Header.Set("Authorization", "Bearer "+c.users[u].key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if !persist {
				return
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict && strings.Contains(string(raw), "run_busy") && persist {
			time.Sleep(300 * time.Millisecond)
			continue
		}
		if !persist {
			c.mu.Lock()
			c.early[resp.StatusCode]++
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		c.settles[name] = resp.StatusCode
		c.mu.Unlock()
		return
	}
}

func (c *chaos) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := map[string]int{}
	for _, r := range c.calls {
		switch {
		case r.transport:
			by["cut"]++
		case r.cancelled:
			by["cancelled"]++
		case r.replayed:
			by["replayed"]++
		default:
			by[strconv.Itoa(r.status)]++
		}
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range by {
			if !yield(k) {
				return
			}
		}
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, by[k]))
	}
	settled := 0
	for _, st := range c.settles {
		if st == http.StatusOK {
			settled++
		}
	}
	return fmt.Sprintf("%d calls (%s), %d named runs (%d settled by their agent; settles sent beside a call: %v), %d kills, %d stalls",
		len(c.calls), strings.Join(parts, " "), len(c.settles), settled, c.early, c.kills, c.stalls)
}

// reconcileAll runs the operator's forced pass until no hold is live: the holds of the
// processes that were killed expire within hold_ttl/run_ttl and their leases within lease_ttl.
func (c *chaos) reconcileAll() {
	t, w := c.t, c.w
	deadline := time.Now().Add(30 * time.Second)
	for passes := 1; ; passes++ {
		cmd := exec.Command(gatewayBin, "reconcile", "-once", "-force", "-config", w.config)
		cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+testenv.RedisURL(t), "UPSTREAM_URL="+w.upstream.URL,
			"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gateway reconcile -once -force: %v\n%s", err, out)
		}
		if n := w.liveHolds(); n == 0 {
			t.Logf("forced reconcile: every hold settled after %d passes", passes)
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d holds still live after %d forced passes; last said: %s", n, passes, out)
		}
		time.Sleep(time.Second)
	}
}

func (c *chaos) audit() {
	t, w := c.t, c.w
	price := w.price
	var rows []holds.Run
	if err := w.db.Select(&rows, "SELECT "+strings.ReplaceAll(`run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro,
		charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok,
		calls, model, discount_bp, estimated, settle_source, expires_at, created_at, settled_at`, "\n", " ")+" FROM run_holds"); err != nil {
		t.Fatal(err)
	}
	byID := map[string]holds.Run{}
	byName := map[string]holds.Run{}
	sources := map[string]int{}
	for _, r := range rows {
		byID[r.RunID] = r
		if r.ClientRunID.Valid {
			byName[r.ClientRunID.String] = r
		}
		sources[r.SettleSource.String]++
		if r.State != holds.StateSettled {
			t.Errorf("run %s: state %s after the forced reconcile", r.RunID, r.State)
		}
		if r.ChargedMicro > r.CapMicro || r.ChargedMicro < 0 {
			t.Errorf("run %s (%s): charged %d over its cap %d", r.RunID, r.SettleSource.String, r.ChargedMicro, r.CapMicro)
		}
	}
	bad, err := holds.Audit(context.Background(), w.db)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bad {
		t.Errorf("ledger audit: user %d day %s run %s: %s", m.UserID, m.Day, m.RunID, m.Detail)
	}
	c.auditOverdraft(rows)

	c.mu.Lock()
	defer c.mu.Unlock()
	killed := func(inc int) bool { _, ok := c.killed[inc]; return ok }
	// exact: a complete call's own run is charged its price, or by the reconciler's rules if
	// the process that served it died before settling it.
	exact := func(what string, rec callRec, row holds.Run, ok bool) {
		want := price.Cost(rec.usage)
		switch {
		case !ok:
			t.Errorf("%s: caller saw a complete answer of run %s, which has no hold", what, rec.runID)
		case row.SettleSource.String == holds.SourceReconcileHold && killed(rec.inc):
			// No tally: the process died between the answer and the tally (DESIGN §5 rule 3).
		case row.ChargedMicro != min(want, row.CapMicro) || row.InTok != rec.usage.Input || row.OutTok != rec.usage.Output:
			t.Errorf("%s: run %s (served by incarnation %d, killed %v) settled by %s: charged %d for in %d out %d; the caller saw in %d out %d, price %d (cap %d, held %d)",
				what, rec.runID, rec.inc, killed(rec.inc), row.SettleSource.String, row.ChargedMicro, row.InTok, row.OutTok,
				rec.usage.Input, rec.usage.Output, want, row.CapMicro, row.HeldMicro)
		}
	}
	var n402, complete int
	idem := map[string][]callRec{}
	runs := map[string][]callRec{}
	for _, rec := range c.calls {
		if rec.status == http.StatusPaymentRequired {
			n402++
		}
		if rec.complete {
			complete++
		}
		switch rec.kind {
		case "plain", "stream", "cancel": // a stream that ended before its cancel is complete
			if rec.complete {
				row, ok := byID[rec.runID]
				exact(rec.kind, rec, row, ok)
			}
		case "idem":
			idem[rec.key] = append(idem[rec.key], rec)
		case "run":
			runs[rec.run] = append(runs[rec.run], rec)
		}
	}

	// Idempotency-Key: at most one attempt ran to a complete answer, kills or not (its answer is
	// pinned before its end is sent), each retry replays it, and it was charged its price.
	for key, recs := range idem {
		u := c.users[recs[0].user]
		var pinned string
		var originals []callRec
		for _, rec := range recs {
			if rec.complete && !rec.replayed {
				originals = append(originals, rec)
			}
		}
		for k, rec := range originals {
			row, ok := byID[rec.runID]
			exact("idem "+key, rec, row, ok)
			if k > 0 {
				t.Errorf("idem %s: ran to a complete answer twice, as %s and %s (first one's process killed: %v)",
					key, originals[k-1].runID, rec.runID, killed(originals[k-1].inc))
			}
			pinned = rec.runID
		}
		completed := 0
		for a := range 50 {
			if row, ok := byID[testIdemRunID(u.id, key, a)]; ok && row.SettleSource.String == holds.SourceComplete {
				completed++
			}
		}
		if completed > max(1, len(originals)) {
			t.Errorf("idem %s: %d attempts settled complete, the caller saw %d complete answers", key, completed, len(originals))
		}
		for _, rec := range recs {
			if rec.replayed && rec.status == http.StatusOK && pinned != "" && rec.runID != pinned {
				t.Errorf("idem %s: a replay names run %s, the complete answer was %s", key, rec.runID, pinned)
			}
		}
	}

	// No charge nobody asked for: a one-call run the callers never heard of is one whose
	// answer a kill cut before its headers.
	known := map[string]bool{}
	var headless int
	for _, rec := range c.calls {
		if rec.runID != "" {
			known[rec.runID] = true
		} else if rec.transport && rec.kind != "run" {
			headless++
		}
	}
	var unknown []string
	for _, r := range rows {
		if r.ChargedMicro > 0 && !r.ClientRunID.Valid && !known[r.RunID] {
			unknown = append(unknown, fmt.Sprintf("%s (%s %d)", r.RunID, r.SettleSource.String, r.ChargedMicro))
		}
	}
	if len(unknown) > headless {
		t.Errorf("%d charged runs no caller saw a run id of, but only %d calls were cut before their headers: %v", len(unknown), headless, unknown)
	}

	// Named runs: charged the calls their agent saw complete, exactly when no call was cut.
	reconciledRuns := 0
	for name, recs := range runs {
		row, ok := byName[name]
		var sum int64
		clean, anyComplete := true, false
		for _, rec := range recs {
			if rec.complete {
				sum += price.Cost(rec.usage)
				anyComplete = true
			} else if rec.transport || rec.cancelled || rec.status == http.StatusOK || rec.status >= 500 {
				clean = false
			}
		}
		if !ok {
			if anyComplete {
				t.Errorf("run %s: the agent saw %d complete calls, the run has no hold", name, len(recs))
			}
			continue
		}
		src := row.SettleSource.String
		if src == holds.SourceReconcile || src == holds.SourceReconcileHold || src == holds.SourceRelease {
			reconciledRuns++
		}
		want := min(sum, row.CapMicro)
		switch {
		case src == holds.SourceReconcileHold && !clean:
			// A call cut by a kill before any tally: charged what it held (DESIGN §5 rule 3).
		case clean && row.ChargedMicro != want:
			t.Errorf("run %s (%s): charged %d (cost %d, %d calls, cap %d), its %d calls that the agent saw complete cost %d",
				name, src, row.ChargedMicro, row.CostMicro, row.Calls, row.CapMicro, len(recs), sum)
		case row.ChargedMicro < want:
			t.Errorf("run %s (%s): charged %d, below the %d of the calls its agent saw complete", name, src, row.ChargedMicro, want)
		}
	}

	srcs := slices.Sorted(func(yield func(string) bool) {
		for k := range sources {
			if !yield(k) {
				return
			}
		}
	})
	var parts []string
	for _, s := range srcs {
		parts = append(parts, fmt.Sprintf("%s=%d", s, sources[s]))
	}
	t.Logf("CHAOS seed %d: %d kills, %d stalls, %d calls (%d seen complete, %d got 402), %d Idempotency-Keys, %d named runs (%d settled by the reconciler); holds by source: %s",
		c.seed, c.kills, c.stalls, len(c.calls), complete, n402, len(idem), len(runs), reconciledRuns, strings.Join(parts, " "))
}

// auditOverdraft checks DESIGN §3's bound per user: what was charged beyond the balance is at
// most Σ (cap − hold) over the holds in flight when the balance ran out (admitted before the
// settlement that crossed it, settled at or after it).
func (c *chaos) auditOverdraft(rows []holds.Run) {
	t := c.t
	if end := c.w.dbNow(); end.YearDay() != c.started.YearDay() {
		t.Logf("the run crossed a UTC day (a new allowance): overdraft not audited")
		return
	}
	for _, u := range c.users {
		var mine []holds.Run
		var total int64
		for _, r := range rows {
			if r.UserID == u.id && r.SettledAt.Valid {
				mine = append(mine, r)
				total += r.ChargedMicro
			}
		}
		if total <= u.allowance {
			continue
		}
		sort.Slice(mine, func(i, j int) bool { return mine[i].SettledAt.Time.Before(mine[j].SettledAt.Time) })
		var cum int64
		var cross time.Time
		for _, r := range mine {
			cum += r.ChargedMicro
			if cum > u.allowance {
				cross = r.SettledAt.Time
				break
			}
		}
		var bound int64
		var late []string
		for _, r := range mine {
			if !r.CreatedAt.After(cross) && !r.SettledAt.Time.Before(cross) {
				bound += r.CapMicro - r.HeldMicro
			} else if r.CreatedAt.After(cross) && r.ChargedMicro > 0 {
				late = append(late, fmt.Sprintf("%s (%s, %d)", r.RunID, r.SettleSource.String, r.ChargedMicro))
			}
		}
		over := total - u.allowance
		t.Logf("user %d: balance %d, charged %d: overdraft %d, bound %d", u.id, u.allowance, total, over, bound)
		if over > bound {
			t.Errorf("user %d: charged %d on a balance of %d: overdraft %d over the bound %d (Σ cap−hold in flight at %s); charged holds admitted after: %v",
				u.id, total, u.allowance, over, bound, cross.Format(time.RFC3339Nano), late)
			sort.Slice(mine, func(i, j int) bool { return mine[i].CreatedAt.Before(mine[j].CreatedAt) })
			for _, r := range mine {
				t.Logf("  %s %-40s created %s settled %s expires %s held %6d cap %6d charged %6d calls %d %s",
					r.RunID, r.ClientRunID.String, r.CreatedAt.Format("15:04:05.000000"), r.SettledAt.Time.Format("15:04:05.000000"),
					r.ExpiresAt.Format("15:04:05.000000"), r.HeldMicro, r.CapMicro, r.ChargedMicro, r.Calls, r.SettleSource.String)
			}
		}
	}
}

// testIdemRunID is proxy.idempotentRunID: the run id of attempt n of an Idempotency-Key.
func testIdemRunID(userID uint64, key string, attempt int) string {
	s := strconv.FormatUint(userID, 10) + "\x00" + key
	if attempt > 0 {
		s += "\x00" + strconv.Itoa(attempt)
	}
	h := sha256.Sum256([]byte(s))
	return "r_" + hex.EncodeToString(h[:16])
}
