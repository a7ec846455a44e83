package e2e

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
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

	"github.com/jmoiron/sqlx"
	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
)

// TestChaosExactlyOnce is a randomized chaos run: two gateway processes share the database
// and Redis; about twenty callers send mixed traffic to either of them (plain and streamed
// calls, streams cancelled mid-way, Idempotency-Key retries to either process, X-Run-Id runs
// whose calls alternate between the processes, users with balances small enough to get 402);
// four more send bursts of long answers (up to 80 000 µUSD against a 20 000 hold) until their
// users' balances run out, and four hold X-Session-Id conversations (a message resent while it
// runs, a newer message replacing it on either process, a regenerate after the end), while a
// chaos loop SIGKILLs a random gateway at random moments and restarts it. After the
// traffic stops every hold is settled by the operator's forced reconcile pass, and the books
// are audited:
//
//   - no hold is left live, and the day ledger is the sum of settled charges (holds.Audit);
//   - no hold is charged over its cap, and no user beyond the overdraft bound of DESIGN §3
//     (what the holds that may have been in flight together were charged over their holds:
//     see auditOverdraft), which the long answers make more than 0;
//   - a call whose caller saw its complete answer with a usage report is charged exactly its
//     price (the fake upstream's deterministic usage at fake-gpt's prices), once — unless the
//     process that served it was killed before it settled: then the reconciler's rules apply
//     (DESIGN §5: from the tally, or the hold when there is none);
//   - a named run is charged the sum of the calls its agent saw complete (exactly, when none
//     of them was cut), never more than its cap;
//   - an Idempotency-Key runs to a complete answer once; its retries replay that run;
//   - a session's duplicate is charged nothing, a superseded message what it used and never
//     as a complete answer, a regenerate runs (see auditSessions).
//
// CHAOS_SEED replays a seed (the schedule of each caller and of the chaos loop; the timing
// of the processes is not replayed), CHAOS_DURATION sets how long the traffic runs (default
// 35s; TestChaosRedisLoss's 20s). CHAOS_STALL=1 also stalls Redis (CLIENT PAUSE) now and
// then, and, with CHAOS_MYSQL_PID set to the MariaDB server's pid, pauses it with SIGSTOP for
// up to a second: both are off by default because `go test ./...` runs other packages
// against the same servers at the same time.
func TestChaosExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	runChaos(t, newWorld(t), 35*time.Second, 0)
}

// TestChaosDeadProcessesFound is TestChaosExactlyOnce with one-call holds that outlive the run
// (hold_ttl 10 min; named runs keep testHoldTTL): each killed process's calls are settled
// because the other process found its heartbeat in the database stale
// (holds.dead_instance_after 7 s), while the traffic runs or just after it, and the books must
// come out as exactly as when the holds expired.
func TestChaosDeadProcessesFound(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	runChaosPlan(t, newWorld(t), 30*time.Second, chaosPlan{kills: true, holdTTL: 10 * time.Minute, runTTL: testHoldTTL,
		deadAfter: 7 * time.Second})
}

// TestChaosRedisLoss is the chaos run with Redis losing everything now and then: FLUSHALL on
// a Redis of the test's own, what a restart without persistence leaves (docker-compose.yml
// runs Redis so). The processes are killed and restarted as in TestChaosExactlyOnce, and the
// books are audited by the same rules, which README keeps through such a loss:
//
//   - a complete call is charged its price (its settlement is the process's own figures; the
//     tally is only evidence);
//   - a named run is charged every call its agent saw complete (its row records each ended
//     call, "so a Redis restart without persistence mid-run loses no call that had ended", and
//     a settlement takes the larger of the row and the tally), never more than its cap ("its
//     charge is still clamped to its cap", though its budget misses the calls in flight at
//     the loss);
//   - an Idempotency-Key runs to a complete answer at most once: a retry whose stored answer
//     Redis lost is 409 idempotent_response_lost, "not run again", naming an attempt that
//     pinned the key, or one the reconciler charged, which cannot be told from one that had
//     pinned it once the record is gone (auditAnswerLost);
//   - the ledger, the caps and the overdraft bound as always.
//
// Exempt, each only where a loss fell inside the window README "Known limits" names: a
// regenerate refused already_running because the loss took its message's end mark before that
// message's run settled (markLost), and a call that outlived its hold's TTL (one stream in ten
// here does, on purpose) whose lease the loss took, so that its run was reconciled under it
// (outlivedHoldAcrossLoss). CHAOS_FLUSHES sets how many losses (default 3), one at a random
// moment of each equal part of the traffic's duration.
func TestChaosRedisLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	runChaos(t, newPrivateRedisWorld(t), 20*time.Second, envCount(t, "CHAOS_FLUSHES", 3))
}

// runChaos runs the traffic, the kills (and flushes Redis flushes times) in world w for
// defaultDuration (CHAOS_DURATION overrides it), then settles everything and audits the books.
func runChaos(t *testing.T, w *world, defaultDuration time.Duration, flushes int) {
	runChaosPlan(t, w, defaultDuration, chaosPlan{flushes: flushes, kills: true})
}

// chaosPlan is what a chaos run does to the processes besides the traffic.
type chaosPlan struct {
	flushes int  // Redis loses everything this many times
	kills   bool // the chaos loop kills and restarts the processes
	// cuts: gateway 0 reaches Redis through this relay, which cuts it off now and then
	// (partitionLoop); gateway 1 and the database stay reachable.
	cuts *freezer
	// restarts: Redis (w.redisURL, a restartableRedis) is stopped this many times, down for
	// up to two seconds each, and started again empty (restartLoop): a restart without
	// persistence, as scripts/services.sh runs Redis.
	restarts int
	redis    *restartableRedis
	// prepaid: the users whose balance runs out get part of it as prepaid credits, and grants
	// (top-ups and refunds) land while their calls run (grantLoop).
	prepaid bool
	// dedup: the processes' dedup.window is 5 s, and the mixed callers now and then send a
	// plain request twice at once, to either process, and resend a copy that failed, as a
	// client's double submit and an SDK's retry do (dupCall).
	dedup bool
	// operator: the operator's forced reconcile pass (`gateway reconcile -once -force`) runs
	// every second or so while the traffic runs, beside the processes' own (operatorLoop).
	operator bool
	// holdTTL, when set, is the processes' hold_ttl and run_ttl instead of testHoldTTL; runTTL,
	// when set, their run_ttl.
	holdTTL, runTTL time.Duration
	// deadAfter, when set, is the processes' holds.dead_instance_after. With kills and a
	// holdTTL past the run, a killed process's one-call holds settle only because another
	// process found it dead (waitDeadSwept); without kills, no process may be found dead.
	deadAfter time.Duration
}

// runChaosPlan is runChaos under plan.
func runChaosPlan(t *testing.T, w *world, defaultDuration time.Duration, plan chaosPlan) {
	flushes := plan.flushes
	seed := time.Now().UnixNano()
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
	}
	duration := defaultDuration
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		var err error
		if duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("CHAOS_DURATION: %v", err)
		}
	}
	t.Logf("chaos seed %d (replay with CHAOS_SEED=%d), traffic for %v, %d Redis losses, %d Redis restarts", seed, seed, duration, flushes, plan.restarts)

	if over := plan.config(); len(over) > 0 {
		w.config = w.writeConfig(over)
	}
	c := &chaos{w: w, t: t, seed: seed, started: w.dbNow(), plan: plan}
	c.setupUsers()
	if plan.cuts != nil {
		c.slots[0].env = []string{"REDIS_URL=redis://" + plan.cuts.addr() + "/0"}
	}
	for i := range c.slots {
		if err := c.slots[i].start(w, i); err != nil {
			t.Fatal(err)
		}
	}

	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var wg sync.WaitGroup
	for i := range allCallers {
		wg.Add(1)
		go func() { defer wg.Done(); c.callerOf(i)(ctx, i) }()
	}
	chaosDone := make(chan struct{})
	go func() { defer close(chaosDone); c.chaosLoop(ctx) }()
	flushDone := make(chan struct{})
	go func() { defer close(flushDone); c.flushLoop(ctx, duration, flushes) }()
	cutDone := make(chan struct{})
	go func() { defer close(cutDone); c.partitionLoop(ctx, duration) }()
	restartDone := make(chan struct{})
	go func() { defer close(restartDone); c.restartLoop(ctx, duration) }()
	grantDone := make(chan struct{})
	go func() { defer close(grantDone); c.grantLoop(ctx) }()
	operatorDone := make(chan struct{})
	go func() { defer close(operatorDone); c.operatorLoop(ctx) }()
	// The stall watch runs until the last call has its answer, recovered's too, not only while
	// calls are sent: recovered's bound and its calls' refusals are judged by it as well.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); c.watchStalls(watchCtx) }()
	wg.Wait()
	<-chaosDone
	<-flushDone
	<-cutDone
	<-restartDone
	<-grantDone
	<-operatorDone
	t.Logf("traffic stopped: %s", c.summary())
	if plan.cuts != nil {
		c.recovered()
	}
	stopWatch()
	<-watchDone

	if plan.deadAfter > 0 {
		c.waitDeadSwept()
	}
	// Both processes go away gracefully (a killed one is already gone); then the operator's
	// forced pass settles whatever is left once it has expired.
	for i := range c.slots {
		s := &c.slots[i]
		s.mu.Lock()
		g, inc := s.g, s.inc
		s.mu.Unlock()
		select {
		case <-g.done:
			// The chaos loop restarts what it kills: a current process already gone died on
			// its own, and the calls it served are audited as a live process's.
			c.mu.Lock()
			_, killed := c.killed[inc]
			c.mu.Unlock()
			if !killed {
				t.Errorf("gateway %s exited on its own before the traffic's end (%v): the chaos loop did not kill it", g.name, g.err)
			}
		default:
			// When each went, for the audit's messages: a run settled by a reconciler
			// before it was settled under its live process, after it by the forced pass.
			t.Logf("SIGTERM to gateway %s at %s", g.name, clock(time.Now()))
			_ = g.cmd.Process.Signal(syscall.SIGTERM)
			if err := g.wait(t, 30*time.Second); err != nil {
				t.Logf("gateway %s ended: %v", g.name, err)
			}
		}
	}
	t.Logf("forced reconcile from %s", clock(time.Now()))
	c.reconcileAll()
	c.audit()
	if plan.cuts != nil {
		c.auditCuts()
	}
	// How often a settle found a run's Redis record short of its row (after a loss) says
	// whether the losses reached the named runs' settlements. (A race a process logged, killed
	// or not, fails the test at its cleanup: tryStart.)
	var rebuilds int
	for i := range c.slots {
		for _, g := range c.slots[i].past {
			b, err := os.ReadFile(g.log)
			if err != nil {
				t.Fatal(err)
			}
			rebuilds += strings.Count(string(b), "run's Redis record lost calls its row records")
		}
	}
	if flushes > 0 {
		t.Logf("CHAOS settles that found a run's Redis record short of its row (busy until rebuilt): %d", rebuilds)
	}
}

// config is the plan's settings over the world's.
func (p chaosPlan) config() map[string]string {
	over := map[string]string{}
	if p.holdTTL > 0 {
		over["holds.hold_ttl"], over["holds.run_ttl"] = p.holdTTL.String(), p.holdTTL.String()
	}
	if p.runTTL > 0 {
		over["holds.run_ttl"] = p.runTTL.String()
	}
	if p.deadAfter > 0 {
		over["holds.dead_instance_after"] = p.deadAfter.String()
	}
	if p.dedup {
		over["dedup.window"] = "5s"
	}
	return over
}

// waitDeadSwept waits, once the traffic has stopped, until no one-call hold is left live by a
// process that is gone: the survivors, beating, find each killed process dead and settle its
// calls, long before their holds expire. Without kills it checks instead that no process was
// found dead: none died.
func (c *chaos) waitDeadSwept() {
	t, w := c.t, c.w
	var alive []string
	for i := range c.slots {
		g, _ := c.slots[i].current()
		alive = append(alive, g.name)
	}
	q, args, err := sqlx.In(`SELECT COUNT(*) FROM run_holds h JOIN instances i ON i.id = h.served_by
		WHERE h.state IN ('queued', 'running') AND h.client_run_id IS NULL AND i.name NOT IN (?)`, alive)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := start.Add(c.plan.deadAfter + 60*time.Second)
	for {
		var left int
		if err := w.db.Get(&left, q, args...); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d one-call holds of killed processes still live %v after the traffic stopped (dead_instance_after %v)",
				left, time.Since(start).Round(time.Millisecond), c.plan.deadAfter)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var dead int
	if err := w.db.Get(&dead, "SELECT COUNT(*) FROM instances WHERE dead_at IS NOT NULL"); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURED: %d processes found dead (%d kills); the last of their one-call holds settled %v after the traffic stopped",
		dead, c.kills, time.Since(start).Round(time.Millisecond))
	if !c.plan.kills && dead > 0 {
		t.Errorf("%d processes found dead in a run that killed none", dead)
	}
}

// The callers: chaosCallers send the mixed traffic on the first mixedUsers users; then
// heavyCallers send long answers in bursts, each on a user of its own whose balance runs out
// (charges above their holds: the overdraft bound has something to check); then
// sessionCallers send X-Session-Id conversations, two callers per user.
const (
	chaosCallers   = 20
	heavyCallers   = 4
	sessionCallers = 4
	allCallers     = chaosCallers + heavyCallers + sessionCallers
	mixedUsers     = 6
)

// callerOf is caller n's traffic.
func (c *chaos) callerOf(n int) func(context.Context, int) {
	switch {
	case n < chaosCallers:
		return c.caller
	case n < chaosCallers+heavyCallers:
		return c.heavyCaller
	default:
		return c.sessionCaller
	}
}

// chaosSlot is one of the two gateway processes, restarted after each kill. Each start is an
// incarnation: the calls it served are exempt from the exact-price check only if it was killed.
type chaosSlot struct {
	env  []string // each incarnation's extra environment
	mu   sync.Mutex
	g    *gateway
	inc  int
	past []*gateway // every incarnation, for their logs
}

var incarnations atomic.Int64

// start runs a new incarnation of slot i (retrying a failed start, as startGatewayWith
// does); safe off the test's goroutine.
func (s *chaosSlot) start(w *world, i int) error {
	inc := int(incarnations.Add(1))
	var err error
	for range 3 {
		var g *gateway
		if g, err = w.tryStart(fmt.Sprintf("gw-%d-%d", i, inc), w.config, s.env, nil); err == nil {
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
	inFlight  int // max_in_flight
}

// callRec is what a caller saw of one HTTP call.
type callRec struct {
	kind      string // plain, stream, cancel, idem, run, heavy, session
	caller    int
	slot      int  // the gateway process it was sent to
	pinned    bool // sent to slot, not to a random process
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
	code      string // the error code of a refusal, or of a stream's error event
	ofRun     string // the run_id a refusal names (already_running: the run answering)
	events    int    // content events the caller read
	sess      string // X-Session-Id
	msg       int    // which message of its session (a resend keeps the number)
	regen     bool   // a resend of the session's last message after its caller saw it complete
	sent      time.Time
	ended     time.Time // when the caller had all of it (or gave up)
	// The request's name in the log of the process that served it: its request id (the
	// response's X-Tollgate-Request-Id) or, for one refused before it had one (its key's
	// lookup), the address it was sent from (the log line's "remote").
	requestID string
	local     string
}

type chaos struct {
	w       *world
	t       *testing.T
	seed    int64
	plan    chaosPlan
	started time.Time // database time
	users   []chaosUser
	slots   [2]chaosSlot

	mu         sync.Mutex
	calls      []callRec
	killed     map[int]time.Time // incarnation -> when it was killed
	kills      int
	stalls     int
	paused     int             // of the stalls, Redis pauses (a session's end mark may then be missed)
	flushed    []time.Time     // when Redis lost everything (FLUSHALL), each as it was answered
	restarted  [][2]time.Time  // when Redis was down for a restart: from its stop to its start answering
	redisUp    chan struct{}   // while Redis is down for a restart, closed once it is up again (nil: up)
	cutOff     [][2]time.Time  // when gateway 0 was cut off from Redis: from, to
	stalled    [][2]time.Time  // when the box stalled, as the test itself measured it (watchStalls)
	lags       [][2]time.Time  // every round of watchStalls late past its pause by lagFloor or more
	watching   time.Time       // when watchStalls' round under way began (zero: not watching)
	cutsWanted int             // how many times partitionLoop is to cut it off (CHAOS_CUTS)
	settles    map[string]int  // named run -> status of the settle the agent sent (0: abandoned)
	last       [allCallers]int // caller -> status of its latest call
	early      map[int]int     // status -> settles sent while a call of the run may run
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
		var grant int64
		if i >= 2 {
			a := 8_000 + r.Int64N(32_000)
			if c.plan.prepaid {
				// Half of the balance today's allowance, half prepaid: charges cross from one
				// to the other while the processes die.
				a, grant = a/2, a-a/2
			}
			allowance, inFlight = &a, 3
		}
		u, key := c.w.user(fmt.Sprintf("chaos-%d", i), inFlight, allowance)
		cu := chaosUser{id: u.ID, key: key, allowance: 2_000_000, inFlight: inFlight}
		if allowance != nil {
			cu.allowance = *allowance
		}
		if grant > 0 {
			c.grant(cu.id, grant)
		}
		c.users = append(c.users, cu)
	}
	// A user per heavy caller, with a balance a few of its long answers spend; then the
	// session callers' users, with the plan's allowance.
	for i := range heavyCallers {
		a := 30_000 + r.Int64N(90_000)
		cu := chaosUser{allowance: a, inFlight: 4}
		if c.plan.prepaid {
			cu.allowance = a / 3
		}
		u, key := c.w.user(fmt.Sprintf("chaos-heavy-%d", i), 4, &cu.allowance)
		cu.id, cu.key = u.ID, key
		if c.plan.prepaid {
			c.grant(cu.id, a-cu.allowance)
		}
		c.users = append(c.users, cu)
	}
	for i := range sessionCallers / 2 {
		u, key := c.w.user(fmt.Sprintf("chaos-session-%d", i), 10, nil)
		c.users = append(c.users, chaosUser{id: u.ID, key: key, allowance: 2_000_000, inFlight: 10})
	}
}

func (c *chaos) record(r callRec) {
	r.ended = time.Now()
	c.mu.Lock()
	c.calls = append(c.calls, r)
	c.last[r.caller] = r.status
	c.mu.Unlock()
}

// chaosLoop kills a random gateway every 1.5–5 s and restarts it 0–1.5 s later.
func (c *chaos) chaosLoop(ctx context.Context) {
	if !c.plan.kills {
		return
	}
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
		// A process exits at its start when Redis cannot be reached: its supervisor starts it
		// again until Redis is back, which the loop does by waiting for it.
		c.awaitRedis()
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
		c.paused++
		c.mu.Unlock()
		c.t.Logf("Redis paused for %v", d)
	} else {
		c.t.Logf("Redis not paused: %v", err)
	}
}

// outlivedHoldAcrossLoss says whether a call outlived its hold's TTL (so only its lease kept
// the reconciler from settling it) and Redis lost everything while it ran (the caller holds
// c.mu): the lease is then gone until its process's next heartbeat, and a reconcile pass in
// that moment settles its run as a dead process's (README "Known limits"). The chaos sends
// such calls on purpose (streamKnobs), which no configuration without a warning does.
func (c *chaos) outlivedHoldAcrossLoss(rec callRec) bool {
	return rec.ended.Sub(rec.sent) > testHoldTTL && c.lostDuring(rec.sent, rec.ended)
}

// outlivedHoldAcrossCut says whether a call outlived its hold's TTL on the process that was cut
// off from Redis while it ran (the caller holds c.mu): its lease lapses lease_ttl after the
// cut's first failed beat, and a pass of the other process's reconciler from then on settles
// its run as a dead process's (README "Known limits").
func (c *chaos) outlivedHoldAcrossCut(rec callRec) bool {
	return c.plan.cuts != nil && rec.slot == 0 && rec.ended.Sub(rec.sent) > cmp.Or(c.plan.holdTTL, testHoldTTL) &&
		slices.ContainsFunc(c.cutOff, func(w [2]time.Time) bool { return w[0].Before(rec.ended) && w[1].After(rec.sent) })
}

// leaseGone says whether a call's lease may have been gone while it ran past its hold (the
// caller holds c.mu): lost with Redis's data, or lapsed while its process was cut off.
func (c *chaos) leaseGone(rec callRec) bool {
	return c.outlivedHoldAcrossLoss(rec) || c.outlivedHoldAcrossCut(rec)
}

// runStory is a named run's calls and the faults around them, in time order, for a failed
// audit's message (the caller holds c.mu): a CI run keeps no gateway's log, and a run charged
// short after a Redis loss is told apart only by when each call ran against the losses, the
// kills and its settlement.
func (c *chaos) runStory(recs []callRec, settled time.Time, price pricing.Price) string {
	type event struct {
		at   time.Time
		what string
	}
	var evs []event
	first, last := settled, settled
	for i, rec := range recs {
		first, last = minTime(first, rec.sent), maxTime(last, rec.ended)
		evs = append(evs, event{rec.sent, fmt.Sprintf("call %d sent to slot %d (incarnation %d)", i, rec.slot, rec.inc)},
			event{rec.ended, fmt.Sprintf("call %d ended %d %s complete %v cost %d", i, rec.status, rec.code, rec.complete, price.Cost(rec.usage))})
	}
	evs = append(evs, event{settled, "settled"})
	for _, at := range c.flushed {
		if !at.Before(first.Add(-time.Second)) && !at.After(last.Add(time.Second)) {
			evs = append(evs, event{at, "Redis lost everything"})
		}
	}
	for inc, at := range c.killed {
		if !at.Before(first.Add(-time.Second)) && !at.After(last.Add(time.Second)) {
			evs = append(evs, event{at, fmt.Sprintf("incarnation %d killed", inc)})
		}
	}
	slices.SortStableFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s %s; ", e.at.Format("15:04:05.000"), e.what)
	}
	return strings.TrimSuffix(b.String(), "; ")
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// lostDuring says whether Redis lost everything between from and to (the caller holds c.mu):
// for the audit's messages, which say whether a call broke a rule around a loss.
func (c *chaos) lostDuring(from, to time.Time) bool {
	return slices.ContainsFunc(c.flushed, func(at time.Time) bool { return !at.Before(from) && !at.After(to) }) ||
		slices.ContainsFunc(c.restarted, func(w [2]time.Time) bool { return !w[1].Before(from) && !w[0].After(to) })
}

// killedDuring reports whether a gateway was killed between from and to (the caller holds c.mu).
func (c *chaos) killedDuring(from, to time.Time) bool {
	for _, at := range c.killed {
		if !at.Before(from) && !at.After(to) {
			return true
		}
	}
	return false
}

// flushLoop makes Redis lose everything (FLUSHALL, a restart without persistence) n times, once
// at a random moment of each n-th of the traffic's duration.
func (c *chaos) flushLoop(ctx context.Context, duration time.Duration, n int) {
	if n == 0 {
		return
	}
	r := rand.New(rand.NewPCG(uint64(c.seed), 98))
	slot := duration / time.Duration(n)
	// The slots are the traffic's own (ctx ends duration after it started): counted from now,
	// the last loss could fall a moment after the traffic stopped, and not happen.
	start := time.Now()
	if end, ok := ctx.Deadline(); ok {
		start = end.Add(-duration)
	}
	for k := range n {
		// In the first nine tenths of its slot: a loss due in the traffic's last instant
		// raced its end, and the audit requires every loss the plan asked for.
		at := start.Add(time.Duration(k)*slot + time.Duration(r.Int64N(int64(slot*9/10))))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		if err := c.w.rdb.FlushAll(context.Background()).Err(); err != nil {
			c.t.Errorf("FLUSHALL: %v", err)
			return
		}
		c.mu.Lock()
		c.flushed = append(c.flushed, time.Now())
		c.mu.Unlock()
		c.t.Logf("Redis lost everything (FLUSHALL) at %s", time.Now().Format("15:04:05.000"))
	}
}

func (c *chaos) caller(ctx context.Context, n int) {
	r := rand.New(rand.NewPCG(uint64(c.seed), uint64(n+1)))
	u := n % mixedUsers
	for i := 0; ctx.Err() == nil; i++ {
		switch p := r.IntN(100); {
		case p < 30 && c.plan.dedup && r.IntN(2) == 0:
			c.dupCall(ctx, r, u, n, i)
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

// heavyCaller sends bursts of two to four concurrent long answers (2 000–8 000 output tokens:
// up to 80 000 µUSD against a hold of at most 20 000) on its own user, until its balance runs
// out: the calls in flight when it does are charged over their holds, within their caps (each
// capped by what was available at its admission; one call alone never overdraws).
func (c *chaos) heavyCaller(ctx context.Context, n int) {
	r := rand.New(rand.NewPCG(uint64(c.seed), uint64(n+1)))
	u := mixedUsers + n - chaosCallers
	for i := 0; ctx.Err() == nil; i++ {
		var wg sync.WaitGroup
		for k := range 2 + r.IntN(3) {
			r2 := rand.New(rand.NewPCG(r.Uint64(), 17))
			wg.Add(1)
			go func() { defer wg.Done(); c.heavyCall(ctx, r2, u, n, i*10+k) }()
		}
		wg.Wait()
		pause := time.Duration(r.IntN(150)) * time.Millisecond
		if c.lastStatus(n) == http.StatusPaymentRequired {
			pause += time.Duration(500+r.IntN(1000)) * time.Millisecond // out of credits: wait
		}
		time.Sleep(pause)
	}
}

// heavyCall is one long answer, whole or streamed (mostly without pauses, so it stays short).
func (c *chaos) heavyCall(ctx context.Context, r *rand.Rand, u, n, i int) {
	stream := r.IntN(2) == 0
	body := chatRequest(stream, 2000+r.IntN(6000), c.message(r, n, i))
	hdr := map[string]string{"X-Fake-Chunks": strconv.Itoa(1500 + r.IntN(7000))}
	if stream && r.IntN(4) == 0 {
		hdr["X-Fake-Chunk-Interval"] = "1ms"
	}
	c.call(ctx, r, callRec{kind: "heavy", user: u, caller: n}, body, hdr, -1)
}

// sessionCaller holds conversations of one X-Session-Id each, on a user it shares with one
// other session caller. A conversation: message 0 streams (on a random gateway); now and then
// it is resent while it runs (409 already_running, unless it has ended or its process died and
// its hold expired); mostly message 1 follows on a random gateway, replacing message 0 if that
// still runs (409 superseded, or a last superseded event); once message 1's caller has its
// whole answer it is resent ("regenerate"), which runs.
func (c *chaos) sessionCaller(ctx context.Context, n int) {
	r := rand.New(rand.NewPCG(uint64(c.seed), uint64(n+1)))
	u := mixedUsers + heavyCallers + (n-chaosCallers-heavyCallers)/2
	for i := 0; ctx.Err() == nil; i++ {
		c.conversation(ctx, r, u, n, i)
		time.Sleep(time.Duration(r.IntN(150)) * time.Millisecond)
	}
}

// conversation is one session's messages; see sessionCaller.
func (c *chaos) conversation(ctx context.Context, r *rand.Rand, u, n, i int) {
	sid := fmt.Sprintf("sess-%d-%d-%d", c.seed, n, i)
	first := chatRequest(true, 5+r.IntN(400), c.message(r, n, i*10))
	firstHdr := map[string]string{"X-Session-Id": sid}
	for k, v := range c.streamKnobs(r) {
		firstHdr[k] = v
	}
	send := func(r *rand.Rand, msg int, body []byte, hdr map[string]string, regen bool) callRec {
		return c.call(ctx, r, callRec{kind: "session", user: u, caller: n, sess: sid, msg: msg, regen: regen}, body, hdr, -1)
	}
	var wg sync.WaitGroup
	async := func(f func(r *rand.Rand)) {
		r2 := rand.New(rand.NewPCG(r.Uint64(), 19))
		wg.Add(1)
		go func() { defer wg.Done(); f(r2) }()
	}
	async(func(r *rand.Rand) { send(r, 0, first, firstHdr, false) })
	time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond)
	if r.IntN(2) == 0 {
		async(func(r *rand.Rand) { send(r, 0, first, firstHdr, false) })
		time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
	}
	if r.IntN(4) == 0 {
		wg.Wait()
		return // the conversation ends with its first message
	}
	stream := r.IntN(2) == 0
	second := chatRequest(stream, 5+r.IntN(400), c.message(r, n, i*10+1))
	secondHdr := map[string]string{"X-Session-Id": sid, "X-Fake-Chunks": strconv.Itoa(5 + r.IntN(150))}
	if stream {
		secondHdr["X-Fake-Chunk-Interval"] = fmt.Sprintf("%dms", 2+r.IntN(10))
	}
	rec := send(r, 1, second, secondHdr, false)
	wg.Wait()
	if rec.complete && r.IntN(2) == 0 {
		send(r, 1, second, secondHdr, true)
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
	content := c.message(r, n, i)
	return chatRequest(stream, 5+r.IntN(400), content)
}

// message is a user message of a random length, unique to caller n's call i.
func (c *chaos) message(r *rand.Rand, n, i int) string {
	words := make([]string, 2+r.IntN(40))
	for k := range words {
		words[k] = strconv.FormatInt(r.Int64N(1e6), 36)
	}
	return fmt.Sprintf("caller %d call %d: %s", n, i, strings.Join(words, " "))
}

// chatRequest is a fake-gpt chat request of one user message.
func chatRequest(stream bool, maxTokens int, content string) []byte {
	m := map[string]any{"model": "fake-gpt", "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}}
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
	if !rec.pinned {
		rec.slot = r.IntN(len(c.slots))
	}
	g, inc := c.slots[rec.slot].current()
	rec.inc, rec.sent = inc, time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var local atomic.Value
	cctx = httptrace.WithClientTrace(cctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		local.Store(ci.Conn.LocalAddr().String())
	}})
	resp, err := do(cctx, g, c.users[rec.user].key, body, hdr)
	rec.local, _ = local.Load().(string)
	if err != nil {
		rec.transport = true
		c.record(rec)
		return rec
	}
	defer resp.Body.Close()
	rec.status, rec.runID = resp.StatusCode, resp.Header.Get(RunIDHeaderForTests)
	rec.requestID = resp.Header.Get(RequestIDHeaderForTests)
	rec.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			rec.transport = true
		}
		var out struct {
			Error struct {
				Code  string `json:"code"`
				RunID string `json:"run_id"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &out) == nil {
			rec.code, rec.ofRun = out.Error.Code, out.Error.RunID
		}
		c.record(rec)
		return rec
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := io.ReadAll(resp.Body)
		var out chatChunk
		if err != nil || json.Unmarshal(raw, &out) != nil {
			rec.transport = true
		} else if out.Usage != nil {
			rec.complete, rec.usage = true, out.usage()
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
		var ev chatChunk
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.Error != nil {
			rec.code = ev.Error.Code
		}
		if ev.Usage != nil {
			sawUsage, rec.usage = true, ev.usage()
		}
		if strings.Contains(line, `"content":"tok`) {
			rec.events++ // a content delta: one output token of the fake upstream
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
			if rec.status != http.StatusConflict && !rec.transport || rec.code == "idempotent_response_lost" {
				break // answered; a lost answer is final: the key is not run again
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
	return fmt.Sprintf("%d calls (%s), %d named runs (%d settled by their agent; settles sent beside a call: %v), %d kills, %d stalls, %d Redis losses",
		len(c.calls), strings.Join(parts, " "), len(c.settles), settled, c.early, c.kills, c.stalls, len(c.flushed))
}

// clock is t's time of day in UTC to the millisecond, as the audit's messages and the gateways'
// logs compare them.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// reconcileAll runs the operator's forced pass until no hold is live, or until liveBound
// has passed since it began: every process has stopped by then.
func (c *chaos) reconcileAll() {
	t, w := c.t, c.w
	deadline := time.Now().Add(c.liveBound())
	for passes := 1; ; passes++ {
		cmd := testenv.DiesWithTests(exec.Command(gatewayBin, "reconcile", "-once", "-force", "-config", w.config))
		cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+w.redisURL, "UPSTREAM_URL="+w.upstream.URL,
			"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gateway reconcile -once -force: %v\n%s", err, out)
		}
		if n := w.liveHolds(); n == 0 {
			t.Logf("forced reconcile: every hold settled after %d passes", passes)
			return
		} else if time.Now().After(deadline) {
			var live []string
			_ = w.db.Select(&live, `SELECT CONCAT_WS(' ', h.run_id, h.state, COALESCE(h.client_run_id, '-'), h.created_at, h.expires_at,
				COALESCE(i.name, '-'), COALESCE(i.dead_at, '-'), COALESCE(i.swept_at, '-'), COALESCE(i.retired, '-'), i.beat_at)
				FROM run_holds h LEFT JOIN instances i ON i.id = h.served_by WHERE h.state IN ('queued', 'running')`)
			t.Fatalf("%d holds still live after %d forced passes (run, state, run name, created, expires, its process: name, dead, swept, retired, beat): %q; last said: %s",
				n, passes, live, out)
		}
		time.Sleep(time.Second)
	}
}

// reconcileMargin is what liveBound adds for the forced passes themselves: each starts a
// process, which connects and scans, on a machine busy with the rest of the tests.
const reconcileMargin = 25 * time.Second

// liveBound is how long after its processes stopped a hold of the run may stay live, by the
// config file the run's processes read: a hold's lease lapses lease_ttl after its process's
// last beat, the reconciler may have extended the hold by its TTL (hold_ttl; a named run's
// run_ttl) just before, and a pass settles it a reconcile_interval after it expired, plus
// reconcileMargin. A fixed bound was right only for the TTLs of its day.
func (c *chaos) liveBound() time.Duration {
	b, err := os.ReadFile(c.w.config)
	if err != nil {
		c.t.Fatal(err)
	}
	var cfg struct {
		Holds config.Holds `yaml:"holds"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		c.t.Fatalf("chaos config %s: %v", c.w.config, err)
	}
	h := cfg.Holds
	if h.HoldTTL <= 0 || h.RunTTL <= 0 || h.LeaseTTL <= 0 || h.ReconcileInterval <= 0 {
		c.t.Fatalf("chaos config %s: hold_ttl %v, run_ttl %v, lease_ttl %v, reconcile_interval %v: want each set",
			c.w.config, h.HoldTTL, h.RunTTL, h.LeaseTTL, h.ReconcileInterval)
	}
	return h.LeaseTTL + max(h.HoldTTL, h.RunTTL) + h.ReconcileInterval + reconcileMargin
}

// readRunRows reads every hold row, and indexes them by run id, by the caller's run name and
// by settlement source (a count).
func readRunRows(t *testing.T, w *world) (rows []holds.Run, byID, byName map[string]holds.Run, sources map[string]int) {
	t.Helper()
	if err := w.db.Select(&rows, "SELECT "+strings.ReplaceAll(`run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro,
		charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok,
		calls, model, discount_bp, estimated, settle_source, expires_at, created_at, settled_at`, "\n", " ")+" FROM run_holds"); err != nil {
		t.Fatal(err)
	}
	byID, byName, sources = map[string]holds.Run{}, map[string]holds.Run{}, map[string]int{}
	for _, r := range rows {
		byID[r.RunID] = r
		if r.ClientRunID.Valid {
			byName[r.ClientRunID.String] = r
		}
		sources[r.SettleSource.String]++
	}
	return rows, byID, byName, sources
}

func (c *chaos) audit() {
	t, w := c.t, c.w
	price := w.price
	rows, byID, byName, sources := readRunRows(t, w)
	for _, r := range rows {
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
	overdrawn, overHold := c.auditOverdraft(rows)

	c.mu.Lock()
	defer c.mu.Unlock()
	killed := func(inc int) bool { _, ok := c.killed[inc]; return ok }
	reconciled := func(r holds.Run) bool {
		return r.SettleSource.String == holds.SourceReconcile || r.SettleSource.String == holds.SourceReconcileHold
	}
	leaseLost := 0             // calls and runs reconciled under a live call whose lease a loss took
	priced := map[string]int{} // kind of call -> complete answers found charged their price
	// exact: a complete call's own run is charged its price, or by the reconciler's rules if
	// the process that served it died before settling it.
	exact := func(what string, rec callRec, row holds.Run, ok bool) {
		want := price.Cost(rec.usage)
		switch {
		case !ok:
			t.Errorf("%s: caller saw a complete answer of run %s, which has no hold", what, rec.runID)
		case row.SettleSource.String == holds.SourceReconcileHold && killed(rec.inc):
			// No tally: the process died between the answer and the tally (DESIGN §5 rule 3).
		case row.ChargedMicro == min(want, row.CapMicro) && row.InTok == rec.usage.Input && row.OutTok == rec.usage.Output:
			// Charged its price, once.
			priced[rec.kind]++
		case reconciled(row) && c.leaseGone(rec):
			// README "Known limits": its lease lost with Redis's data, or lapsed while its
			// process was cut off from Redis, reconciled while it ran.
			leaseLost++
			t.Logf("%s: run %s reconciled (%s, charged %d, price %d) under the call, its lease lost with Redis's data or lapsed while its process was cut off (README Known limits)",
				what, rec.runID, row.SettleSource.String, row.ChargedMicro, want)
		default:
			// The times tell who settled it: a reconciler while the processes ran (its hold
			// expired before its own settlement), or the forced pass after they stopped.
			t.Errorf("%s: run %s (served by gw-%d-%d, killed %v, Redis lost during it %v) settled by %s: charged %d for in %d out %d; the caller saw in %d out %d, price %d (cap %d, held %d); sent %s, caller had its end %s, hold created %s, expires %s, settled %s",
				what, rec.runID, rec.slot, rec.inc, killed(rec.inc), c.lostDuring(rec.sent, rec.ended), row.SettleSource.String, row.ChargedMicro, row.InTok, row.OutTok,
				rec.usage.Input, rec.usage.Output, want, row.CapMicro, row.HeldMicro, clock(rec.sent), clock(rec.ended), clock(row.CreatedAt),
				clock(row.ExpiresAt), clock(row.SettledAt.Time))
		}
	}
	var n402, complete, lostAnswers, replays, runsPriced int
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
		case "plain", "stream", "cancel", "heavy", "dup": // a stream that ended before its cancel is complete
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
			if rec.replayed && rec.status == http.StatusOK && pinned != "" {
				replays++
			}
			if rec.replayed && rec.status == http.StatusOK && pinned != "" && rec.runID != pinned {
				t.Errorf("idem %s: a replay names run %s, the complete answer was %s", key, rec.runID, pinned)
			}
			if rec.code == "idempotent_response_lost" {
				lostAnswers++
				c.auditAnswerLost(key, u.id, rec, recs[0].sent, pinned, byID)
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
		lost := c.lostDuring(recs[0].sent, row.SettledAt.Time.Add(time.Second))
		want := min(sum, row.CapMicro)
		if clean && anyComplete && row.ChargedMicro == want {
			runsPriced++
		}
		switch {
		case src == holds.SourceReconcileHold && !clean:
			// A call cut by a kill before any tally: charged what it held (DESIGN §5 rule 3).
		case (row.ChargedMicro != want && clean || row.ChargedMicro < want) && reconciled(row) &&
			slices.ContainsFunc(recs, c.leaseGone):
			// README "Known limits": a call's lease lost with Redis's data, or lapsed while its
			// process was cut off from Redis, reconciled under it.
			leaseLost++
			t.Logf("run %s reconciled (%s, charged %d) under a call whose lease was lost with Redis's data or lapsed while its process was cut off; its agent's complete calls cost %d (README Known limits)",
				name, src, row.ChargedMicro, sum)
		case clean && row.ChargedMicro != want:
			t.Errorf("run %s (%s): charged %d (cost %d, %d calls, cap %d), its %d calls that the agent saw complete cost %d (Redis lost during them: %v); %s",
				name, src, row.ChargedMicro, row.CostMicro, row.Calls, row.CapMicro, len(recs), sum, lost, c.runStory(recs, row.SettledAt.Time, price))
		case row.ChargedMicro < want:
			t.Errorf("run %s (%s): charged %d, below the %d of the calls its agent saw complete (Redis lost during them: %v); %s",
				name, src, row.ChargedMicro, want, lost, c.runStory(recs, row.SettledAt.Time, price))
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
	sess := c.auditSessions(rows, byID, exact, killed)
	t.Logf("CHAOS seed %d: %d kills, %d stalls, %d Redis losses, %d calls (%d seen complete, %d got 402), %d Idempotency-Keys (%d answers lost), %d named runs (%d settled by the reconciler); holds by source: %s; reconciled under a live call whose lease a loss took: %d",
		c.seed, c.kills, c.stalls, len(c.flushed), len(c.calls), complete, n402, len(idem), lostAnswers, len(runs), reconciledRuns, strings.Join(parts, " "), leaseLost)
	t.Logf("CHAOS overdraft bound checked on %d users, %d of them with charges over their holds; sessions: %s", overdrawn, overHold, sess)
	c.auditExercised(priced, replays, runsPriced)
}

// auditExercised fails a chaos run that checked its rules on nothing (the caller holds c.mu).
// Every rule above reads "each X that was seen is right": gateways that refused every call (a
// build or a configuration they reject, a route gone) or a run too short for its kills, Redis
// losses and partitions passed the audit with nothing audited. Each kind of traffic the
// callers sent (a cancelled stream aside: it may never be whole) must have had complete
// answers found charged their price, Idempotency-Keys a replay of the answer that ran, named
// runs one charged exactly its agent's complete calls; and the chaos the plan asked for must
// have happened, every kill, loss and partition of it.
func (c *chaos) auditExercised(priced map[string]int, replays, runsPriced int) {
	t := c.t
	sent := map[string]bool{}
	for _, rec := range c.calls {
		sent[rec.kind] = true
	}
	if len(sent) == 0 {
		t.Errorf("no call was sent: the audit checked nothing")
	}
	for _, kind := range []string{"plain", "stream", "heavy", "idem", "session", "dup"} {
		if sent[kind] && priced[kind] == 0 {
			t.Errorf("no %s call was seen complete and found charged its price: the audit checked none", kind)
		}
	}
	if sent["idem"] && replays == 0 {
		t.Errorf("no Idempotency-Key retry was answered with the replay of the key's complete answer: the replay rule checked nothing")
	}
	if sent["run"] && runsPriced == 0 {
		t.Errorf("no named run was charged exactly its agent's complete calls: the named-run rule checked nothing")
	}
	if c.plan.kills && c.kills == 0 {
		t.Errorf("no gateway was killed: the traffic (CHAOS_DURATION) ended before the first kill")
	}
	if len(c.restarted) != c.plan.restarts {
		t.Errorf("Redis was restarted %d times, the plan asked for %d", len(c.restarted), c.plan.restarts)
	}
	if len(c.flushed) != c.plan.flushes {
		t.Errorf("Redis lost everything %d times, the plan asked for %d", len(c.flushed), c.plan.flushes)
	}
	if c.plan.cuts != nil && len(c.cutOff) != c.cutsWanted {
		t.Errorf("gateway 0 was cut off from Redis %d times, the plan asked for %d", len(c.cutOff), c.cutsWanted)
	}
}

// auditAnswerLost: a 409 idempotent_response_lost (Redis lost the key's stored answer: README,
// "it is not run again") names an attempt of that key that pinned it — settled complete, or a
// stream broken after output — and, when a caller saw a complete answer of the key, that one.
// Or, when Redis lost everything since the key was first sent (from), an attempt the reconciler
// settled at a cost: with the record gone, its row cannot tell whether it pinned the key, and
// it is taken as pinned (proxy attemptPinned: an answer pinned, then its process killed, is
// not run and charged again). So too, with Redis whole, an attempt charged its hold after a
// kill: one killed between its admission and its record's first write left no record
// (README Known limits; proxy TestIdemAttemptKilledRightAfterItsAdmissionIsChargedOnce).
func (c *chaos) auditAnswerLost(key string, userID uint64, rec callRec, from time.Time, pinned string, byID map[string]holds.Run) {
	t := c.t
	attempt := -1
	for a := range 50 {
		if testIdemRunID(userID, key, a) == rec.ofRun {
			attempt = a
			break
		}
	}
	row, ok := byID[rec.ofRun]
	src := row.SettleSource.String
	switch {
	case attempt < 0 || !ok:
		t.Errorf("idem %s: idempotent_response_lost names run %q, no attempt of the key (hold found: %v)", key, rec.ofRun, ok)
	case src != holds.SourceComplete && !(src == holds.SourceStreamError && row.OutTok > 0) &&
		!(c.lostDuring(from, rec.sent) && (src == holds.SourceReconcileHold || src == holds.SourceReconcile && row.CostMicro > 0)) &&
		!(c.killedDuring(from, rec.sent) && src == holds.SourceReconcileHold):
		t.Errorf("idem %s: idempotent_response_lost names attempt %d (%s), settled %s with %d output tokens: it never pinned the key",
			key, attempt, rec.ofRun, src, row.OutTok)
	case pinned != "" && rec.ofRun != pinned:
		t.Errorf("idem %s: idempotent_response_lost names run %s, the complete answer was %s", key, rec.ofRun, pinned)
	}
}

// auditSessions checks the X-Session-Id traffic against README "Retries and duplicates are
// charged once" (the caller holds c.mu):
//
//   - a message whose caller saw its complete answer is charged its price (as any call);
//   - a 409 already_running names a live run of the same session and the same message, and
//     the duplicate's own hold is released at 0: every hold settled as a duplicate is charged
//     nothing and belongs to a user with session traffic, at least one per 409 seen;
//   - a message told superseded (409, or a last superseded event) was replaced by another
//     message of its session: one of different content was sent (claims are ordered as they
//     reach the database, so message 1 may be replaced by a late resend of message 0), and a
//     regenerate, sent when nothing else of its session is in flight, never is. It is never
//     settled as a complete answer, and is charged what it used (its
//     usage at fake-gpt's prices, within its cap, the content it relayed counted) unless its
//     process died and the reconciler charged its hold (README "Known limits");
//   - a regenerate (the last message resent after its caller had it whole) is not refused
//     already_running — its end was marked in Redis before the answer's end was sent; only a
//     Redis pause, or a loss of Redis's data after the mark (README "Known limits"), can lose
//     that mark — and one that ran is its session's current run.
func (c *chaos) auditSessions(rows []holds.Run, byID map[string]holds.Run,
	exact func(string, callRec, holds.Run, bool), killed func(int) bool) string {
	t := c.t
	msgs := map[string][2]bool{}  // session -> which of its messages were sent
	byRun := map[string]callRec{} // run id -> the session call that named it
	users := map[uint64]bool{}    // users with session traffic
	for _, rec := range c.calls {
		if rec.kind != "session" {
			continue
		}
		m := msgs[rec.sess]
		m[rec.msg] = true
		msgs[rec.sess] = m
		users[c.users[rec.user].id] = true
		if rec.runID != "" {
			byRun[rec.runID] = rec
		}
	}
	current := c.sessionRuns()
	dupSeen := map[uint64]int{}
	var superseded, supersededRuns, regens, regensLost int
	for _, rec := range c.calls {
		if rec.kind != "session" {
			continue
		}
		what := fmt.Sprintf("session %s message %d (regenerate %v)", rec.sess, rec.msg, rec.regen)
		uid := c.users[rec.user].id
		if rec.complete {
			row, ok := byID[rec.runID]
			exact(what, rec, row, ok)
		}
		switch rec.code {
		case "already_running":
			dupSeen[uid]++
			c.auditAlreadyRunning(what, rec, uid, byID, byRun)
			if rec.regen && (c.markLost(rec) || c.markCut(rec)) {
				regensLost++ // README "Known limits": its end mark lost with Redis's data, or never written
			} else if rec.regen && c.paused == 0 {
				t.Errorf("%s: refused already_running (run %s), its caller had the whole answer before resending it", what, rec.ofRun)
			}
		case "superseded":
			superseded++
			if rec.regen || !msgs[rec.sess][1-rec.msg] {
				t.Errorf("%s: told superseded, but no other message of its session was in flight", what)
			}
			if rec.runID != "" {
				supersededRuns++
				row, ok := byID[rec.runID]
				c.auditSuperseded(what, rec, row, ok, killed(rec.inc))
			}
		}
		if rec.regen && rec.status == http.StatusOK && rec.runID != "" {
			regens++
			if current[rec.sess] != rec.runID {
				t.Errorf("%s: ran as %s, the session's current run is %q", what, rec.runID, current[rec.sess])
			}
		}
	}
	dupUsers := map[uint64]bool{} // users with plain requests sent twice (chaosPlan.dedup)
	for _, rec := range c.calls {
		if rec.kind == "dup" {
			dupUsers[c.users[rec.user].id] = true
		}
	}
	dupRows := map[uint64]int{}
	for _, r := range rows {
		if r.SettleSource.String != holds.SourceDuplicate {
			continue
		}
		dupRows[r.UserID]++
		if r.ChargedMicro != 0 || !users[r.UserID] && !dupUsers[r.UserID] {
			t.Errorf("duplicate %s of user %d (session traffic %v, plain requests sent twice %v): charged %d, want a release at 0 of a resend",
				r.RunID, r.UserID, users[r.UserID], dupUsers[r.UserID], r.ChargedMicro)
		}
	}
	for uid, n := range dupSeen {
		if dupRows[uid] < n {
			t.Errorf("user %d: %d callers saw already_running, only %d holds were released as duplicates", uid, n, dupRows[uid])
		}
	}
	var dups int
	for _, n := range dupSeen {
		dups += n
	}
	return fmt.Sprintf("%d conversations, %d told superseded (%d of them after forwarding), %d already_running, %d regenerates ran (%d refused after a Redis loss or a cut)",
		len(msgs), superseded, supersededRuns, dups, regens, regensLost)
}

// markLost says whether Redis lost everything between the start of the message a regenerate
// resends and the regenerate's end (the caller holds c.mu): the end mark of that message, set
// just before its answer's end was sent, may then be gone while its run is not settled yet.
func (c *chaos) markLost(regen callRec) bool {
	for _, prev := range c.calls {
		if prev.kind == "session" && prev.sess == regen.sess && prev.msg == regen.msg && !prev.regen && prev.complete &&
			c.lostDuring(prev.sent, regen.ended) {
			return true
		}
	}
	return false
}

// markCut says whether a regenerate met its message's end mark missing or unread because the
// process cut off from Redis stood on either side (the caller holds c.mu): the message ended
// there while it was cut off (its end mark, written at most a Redis step's deadline before its
// caller had the end, then failed), or the regenerate went there while it was cut off (the
// mark could not be read). Until the message's run settles the same message is then
// already_running, as after a loss (README "Known limits").
func (c *chaos) markCut(regen callRec) bool {
	const markDeadline = 2 * time.Second // a Redis step's deadline on the caller's path
	// The mark's write and the caller's end are markDeadline apart on a box that keeps time;
	// one that stalls between them (CI's two cores) puts the end later by what it stood still.
	cutAround := func(from, to time.Time) bool {
		return slices.ContainsFunc(c.cutOff, func(w [2]time.Time) bool { return !w[0].After(to) && !w[1].Before(from) })
	}
	if regen.slot == 0 && cutAround(regen.sent, regen.ended) {
		return true
	}
	for _, prev := range c.calls {
		if prev.kind == "session" && prev.sess == regen.sess && prev.msg == regen.msg && !prev.regen && prev.complete &&
			prev.slot == 0 && cutAround(prev.ended.Add(-markDeadline-c.stalledFor(prev.sent, prev.ended)), prev.ended) {
			return true
		}
	}
	return false
}

// auditAlreadyRunning: the run a 409 already_running names has a hold of the same user and,
// when a caller of it saw its id, was asked the same message of the same session.
func (c *chaos) auditAlreadyRunning(what string, rec callRec, uid uint64, byID map[string]holds.Run, byRun map[string]callRec) {
	t := c.t
	row, ok := byID[rec.ofRun]
	switch {
	case !ok:
		t.Errorf("%s: already_running names run %q, which has no hold", what, rec.ofRun)
	case row.UserID != uid:
		t.Errorf("%s: already_running names run %s of user %d, not the caller's %d", what, rec.ofRun, row.UserID, uid)
	}
	if other, ok := byRun[rec.ofRun]; ok && (other.sess != rec.sess || other.msg != rec.msg) {
		t.Errorf("%s: already_running names run %s, which answers session %s message %d", what, rec.ofRun, other.sess, other.msg)
	}
}

// auditSuperseded: a run replaced by a newer message is charged what it used, never as a
// complete answer; a killed process's run may instead be charged its hold by the reconciler.
func (c *chaos) auditSuperseded(what string, rec callRec, row holds.Run, ok, killed bool) {
	t := c.t
	used := pricing.Usage{Input: row.InTok, CacheRead: row.CacheReadTok, CacheWrite: row.CacheWriteTok, Output: row.OutTok}
	src := row.SettleSource.String
	switch {
	case !ok:
		t.Errorf("%s: superseded run %s has no hold", what, rec.runID)
	case src == holds.SourceComplete:
		t.Errorf("%s: told superseded, run %s settled as a complete answer (charged %d)", what, rec.runID, row.ChargedMicro)
	case killed && (src == holds.SourceReconcileHold || src == holds.SourceReconcile):
		// Its process died before settling it: the reconciler's rules (DESIGN §5).
	case row.ChargedMicro != min(c.w.price.Cost(used), row.CapMicro) || row.OutTok < int64(rec.events):
		t.Errorf("%s: superseded run %s settled by %s: charged %d for in %d out %d (price %d, cap %d); its caller read %d tokens",
			what, rec.runID, src, row.ChargedMicro, row.InTok, row.OutTok, c.w.price.Cost(used), row.CapMicro, rec.events)
	}
}

// sessionRuns reads each session's current run.
func (c *chaos) sessionRuns() map[string]string {
	var rows []struct {
		Session string `db:"session_id"`
		Run     string `db:"current_run_id"`
	}
	if err := c.w.db.Select(&rows, "SELECT session_id, current_run_id FROM sessions"); err != nil {
		c.t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[r.Session] = r.Run
	}
	return out
}

// auditOverdraft checks DESIGN §3's bound per user: admission keeps the holds in flight
// together within what was available, so what was charged beyond the balance is at most what
// the calls in flight together when it ran out were charged over their holds (each within its
// cap, checked per run: hence within Σ cap − hold).
//
// Which calls those were, the rows cannot tell by their times: created_at and settled_at are
// the clock of a batch transaction read before its user lock wait, so a settlement stamped
// before an admission may have committed after it (the admission then saw its hold live).
// The bound therefore takes no order from them: at most max_in_flight unexpired holds are in
// flight together, so it counts the largest max_in_flight excesses over hold, plus every
// excess of a hold that may have been in flight past its expiry uncounted (a named run, a
// call longer than half of hold_ttl, one its process died under), all of which the admission
// counted as held but not in flight.
//
// It returns how many users it checked (charged past their balance) and how many of them had
// charges over their holds (what makes the bound more than 0).
func (c *chaos) auditOverdraft(rows []holds.Run) (overdrawn, overHold int) {
	t := c.t
	if end := c.w.dbNow(); end.YearDay() != c.started.YearDay() {
		t.Logf("the run crossed a UTC day (a new allowance): overdraft not audited")
		return 0, 0
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
		// The balance: today's allowance and what grants gave (prepaid plans: each grant,
		// top-up or refund, as it landed).
		var granted int64
		if err := c.w.db.Get(&granted, "SELECT COALESCE(SUM(amount_micro), 0) FROM grants WHERE user_id = ?", u.id); err != nil {
			t.Fatal(err)
		}
		balance := u.allowance + granted
		if total <= balance {
			continue
		}
		overdrawn++
		if slices.ContainsFunc(mine, func(r holds.Run) bool { return r.ChargedMicro > r.HeldMicro }) {
			overHold++
		}
		bound, counted := overdraftBound(mine, u.inFlight)
		over := total - balance
		t.Logf("user %d: balance %d, charged %d: overdraft %d, bound %d (excess over hold of %d runs)", u.id, balance, total, over, bound, counted)
		if over > bound {
			t.Errorf("user %d: charged %d on a balance of %d: overdraft %d over the bound %d (excess over hold of %d runs, max_in_flight %d)",
				u.id, total, balance, over, bound, counted, u.inFlight)
			sort.Slice(mine, func(i, j int) bool { return mine[i].CreatedAt.Before(mine[j].CreatedAt) })
			for _, r := range mine {
				t.Logf("  %s %-40s created %s settled %s expires %s held %6d cap %6d charged %6d calls %d %s",
					r.RunID, r.ClientRunID.String, r.CreatedAt.Format("15:04:05.000000"), r.SettledAt.Time.Format("15:04:05.000000"),
					r.ExpiresAt.Format("15:04:05.000000"), r.HeldMicro, r.CapMicro, r.ChargedMicro, r.Calls, r.SettleSource.String)
			}
		}
	}
	return overdrawn, overHold
}

// overdraftBound is what a user's runs were charged over their holds that may have been in
// flight together (see auditOverdraft), and how many runs it counts.
func overdraftBound(mine []holds.Run, inFlight int) (bound int64, counted int) {
	var rest []int64
	for _, r := range mine {
		excess := r.ChargedMicro - r.HeldMicro
		if excess <= 0 {
			continue
		}
		src := r.SettleSource.String
		if r.ClientRunID.Valid || src == holds.SourceReconcile || src == holds.SourceReconcileHold ||
			r.SettledAt.Time.Sub(r.CreatedAt) >= testHoldTTL/2 {
			bound += excess
			counted++
			continue
		}
		rest = append(rest, excess)
	}
	slices.Sort(rest)
	slices.Reverse(rest)
	for _, e := range rest[:min(inFlight, len(rest))] {
		bound += e
		counted++
	}
	return bound, counted
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

// chatChunk is what the e2e tests read of a chat completion, a streamed event or a whole
// answer: whether it has choices, its usage and its error's code.
type chatChunk struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *struct {
		Prompt     int64 `json:"prompt_tokens"`
		Completion int64 `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// usage is the chunk's usage as the gateway prices it (nil: none).
func (c chatChunk) usage() pricing.Usage {
	if c.Usage == nil {
		return pricing.Usage{}
	}
	return pricing.Usage{Input: c.Usage.Prompt, Output: c.Usage.Completion}
}
