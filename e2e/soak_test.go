package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestChaosSoakRedisRestartPrepaid is the chaos run where the faults meet the prepaid credits:
// the users whose balance runs out hold half of it (a third, the heavy callers' users) as
// today's allowance and the rest as prepaid credits, and grants land while their calls run
// (top-ups, refunds that may be refused for what calls in flight hold, a webhook's grant
// delivered twice); the processes are killed and restarted as in TestChaosExactlyOnce, and
// Redis itself is stopped once, down for up to two seconds, and started again empty (a
// restart without persistence, as scripts/services.sh and docker-compose.yml run it: its
// clients see refused connections, then a server that has lost everything); and the
// fingerprint window is on (dedup.window 5 s), with plain requests sent twice at once and
// resent after a failure (dupCall): a duplicate is released at 0; and the operator's forced
// reconcile pass runs every second beside the processes' own reconcilers. The books are
// audited by TestChaosExactlyOnce's rules, with the restart's window taken as a loss
// (lostDuring), and the overdraft bound reckoned on each user's allowance plus what their
// grants gave; holds.Audit checks each user's prepaid credits against their grants and the
// prepaid parts of their charges. CHAOS_SEED replays a seed, CHAOS_DURATION sets the
// traffic's length (default 30s), CHAOS_RESTARTS how many restarts (default 1).
func TestChaosSoakRedisRestartPrepaid(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	r := startRestartableRedis(t)
	w := newWorldOn(t, testenv.MySQLDSN(t), r.url())
	runChaosPlan(t, w, 30*time.Second, chaosPlan{kills: true, restarts: envCount(t, "CHAOS_RESTARTS", 1), redis: r, prepaid: true,
		dedup: true, operator: true})
	// What the prepaid rules were checked on: grants that landed while the traffic ran, and
	// charges that took prepaid credits (holds.Audit, in the run's audit, compared them).
	var during, fromPrepaid int64
	if err := w.db.Get(&during, "SELECT COUNT(*) FROM grants WHERE reason = 'soak' AND idempotency_key NOT LIKE '%-user-%'"); err != nil {
		t.Fatal(err)
	}
	if err := w.db.Get(&fromPrepaid, "SELECT COUNT(*) FROM run_holds WHERE prepaid_part_micro > 0"); err != nil {
		t.Fatal(err)
	}
	t.Logf("SOAK %d grants landed during the traffic; %d charges took prepaid credits", during, fromPrepaid)
	if during == 0 || fromPrepaid == 0 {
		t.Errorf("%d grants landed during the traffic, %d charges took prepaid credits: the prepaid books were checked on nothing", during, fromPrepaid)
	}
}

// restartableRedis is a redis-server of the test's own, without persistence, that the test
// stops and starts again on the same port: a restart its clients see as one (connections
// refused while it is down, then an empty server at the same address).
type restartableRedis struct {
	t      *testing.T
	bin    string
	port   int
	dir    string // its working directory and Unix socket
	cmd    *exec.Cmd
	exited chan struct{}
	out    *bytes.Buffer
}

func startRestartableRedis(t *testing.T) *restartableRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run the tests with `make test`, which installs it")
	}
	// Not under t.TempDir(): a socket's path is limited to 107 bytes, which a long test name
	// passes.
	dir, err := os.MkdirTemp("", "tgredis")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r := &restartableRedis{t: t, bin: bin, dir: dir}
	t.Cleanup(func() {
		if r.cmd != nil {
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	})
	// A free port found by closing it may be taken before the server binds it: try another.
	// Below Linux's ephemeral range (32768-60999), as scripts/services.sh picks its ports: in
	// the moment the server is down, a client connection's own port could take one in it.
	for range 10 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use
		}
		ln.Close()
		r.port = port
		if err = r.start(); err == nil {
			return r
		}
		t.Logf("redis-server on port %d: %v", r.port, err)
	}
	t.Fatal("redis-server did not start on any of 10 ports")
	return nil
}

func (r *restartableRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *restartableRedis) sock() string { return filepath.Join(r.dir, "redis.sock") }

// start runs the server on its port and waits until it answers on its Unix socket (asked on
// the port, another server that took it would answer for it).
func (r *restartableRedis) start() error {
	r.out = &bytes.Buffer{}
	r.cmd = testenv.DiesWithTests(exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--unixsocket", r.sock(), "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", r.dir))
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	r.exited = exited
	go func() { _ = r.cmd.Wait(); close(exited) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		c := redis.NewClient(&redis.Options{Network: "unix", Addr: r.sock(), MaxRetries: -1, DisableIdentity: true})
		err := c.Ping(ctx).Err()
		c.Close()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			r.cmd = nil
			return fmt.Errorf("redis-server exited at start: %s", r.out.String())
		case <-ctx.Done():
			return fmt.Errorf("redis-server did not answer within 10 s: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop shuts the server down without saving (its data is gone) and waits until it has exited.
func (r *restartableRedis) stop() error {
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: r.sock(), MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	// The server closes the connection as it goes: no reply is the usual answer.
	if err := c.Do(context.Background(), "SHUTDOWN", "NOSAVE").Err(); err != nil && !errors.Is(err, redis.ErrClosed) &&
		!isConnGone(err) {
		return fmt.Errorf("SHUTDOWN NOSAVE: %w", err)
	}
	select {
	case <-r.exited:
		r.cmd = nil
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("redis-server still running 10 s after SHUTDOWN NOSAVE")
	}
}

// isConnGone says whether err is the connection closing under a command (EOF, reset).
func isConnGone(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrClosed) || errors.As(err, &ne) || err.Error() == "EOF"
}

// restartLoop restarts the plan's Redis plan.restarts times, once at a random moment of each
// equal part of the traffic's duration (in its first nine tenths: a restart due in the
// traffic's last instant raced its end), each down for 0.3–2 s.
func (c *chaos) restartLoop(ctx context.Context, duration time.Duration) {
	n := c.plan.restarts
	if n == 0 {
		return
	}
	r := rand.New(rand.NewPCG(uint64(c.seed), 96))
	slot := duration / time.Duration(n)
	start := time.Now()
	if end, ok := ctx.Deadline(); ok {
		start = end.Add(-duration)
	}
	for k := range n {
		at := start.Add(time.Duration(k)*slot + time.Duration(r.Int64N(int64(slot*9/10))))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		up := make(chan struct{})
		c.mu.Lock()
		c.redisUp = up
		c.mu.Unlock()
		from := time.Now()
		if err := c.plan.redis.stop(); err != nil {
			c.t.Errorf("stop Redis: %v", err)
			close(up) // the chaos loop's restarts wait no longer: the test has failed
			return
		}
		time.Sleep(time.Duration(300+r.IntN(1700)) * time.Millisecond)
		var err error
		for range 3 {
			if err = c.plan.redis.start(); err == nil {
				break
			}
		}
		if err != nil {
			c.t.Errorf("start Redis again on port %d: %v", c.plan.redis.port, err)
			close(up)
			return
		}
		c.mu.Lock()
		c.restarted = append(c.restarted, [2]time.Time{from, time.Now()})
		c.redisUp = nil
		c.mu.Unlock()
		close(up)
		c.t.Logf("Redis down from %s to %s (restarted without persistence)", clock(from), clock(time.Now()))
	}
}

// awaitRedis waits while restartLoop has Redis down: a process started then exits at its
// start ("gateway: redis …: connection refused").
func (c *chaos) awaitRedis() {
	c.mu.Lock()
	up := c.redisUp
	c.mu.Unlock()
	if up != nil {
		<-up
	}
}

// grantLoop, under a prepaid plan, lands a grant every 0.5–2 s on a user whose balance runs
// out: mostly a top-up, one in four a refund (refused, and not applied, when it would take
// prepaid credits below what calls in flight hold past the allowance), half of those of
// everything prepaid, and one in five sent again under its key, as a payment webhook is
// redelivered (applied once).
func (c *chaos) grantLoop(ctx context.Context) {
	if !c.plan.prepaid {
		return
	}
	r := rand.New(rand.NewPCG(uint64(c.seed), 95))
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(500+r.IntN(1500)) * time.Millisecond):
		}
		u := c.users[2+r.IntN(mixedUsers-2+heavyCallers)]
		amount := 5_000 + r.Int64N(25_000)
		switch r.IntN(8) {
		case 0:
			amount = -(1_000 + r.Int64N(10_000))
		case 1:
			// A refund of everything prepaid: refused while calls in flight hold part of it
			// beyond the allowance left, which they would otherwise charge into a debt.
			var prepaid int64
			if err := c.w.db.Get(&prepaid, "SELECT prepaid_micro FROM users WHERE id = ?", u.id); err != nil {
				c.t.Errorf("prepaid of user %d: %v", u.id, err)
				return
			}
			if prepaid <= 0 {
				continue
			}
			amount = -prepaid
		}
		key := fmt.Sprintf("soak-%d-%d", c.seed, k)
		req := holds.GrantRequest{UserID: u.id, AmountMicro: amount, IdempotencyKey: key, Reason: "soak"}
		for range 1 + min(1, r.IntN(5)/4) {
			if _, _, err := c.w.store.Grant(context.Background(), req); err != nil && !errors.Is(err, holds.ErrGrantBelowZero) {
				c.t.Errorf("grant %s of %d to user %d: %v", key, amount, u.id, err)
				return
			}
		}
	}
}

// grant tops up user id's prepaid credits by amount before the traffic starts.
func (c *chaos) grant(id uint64, amount int64) {
	c.t.Helper()
	if _, _, err := c.w.store.Grant(context.Background(), holds.GrantRequest{UserID: id, AmountMicro: amount,
		IdempotencyKey: fmt.Sprintf("soak-%d-user-%d", c.seed, id), Reason: "soak"}); err != nil {
		c.t.Fatalf("grant %d to user %d: %v", amount, id, err)
	}
}

// dupCall sends one plain request twice at once, each copy to a random process (a double
// submit), and resends a copy that got no answer or a 5xx once, as an SDK retries. Under
// dedup.window a copy sent while another runs is 409 duplicate, its hold released at 0; each
// copy whose caller saw the whole answer is audited as a plain call (charged its price).
func (c *chaos) dupCall(ctx context.Context, r *rand.Rand, u, n, i int) {
	body := c.body(r, false, n, i)
	hdr := map[string]string{"X-Fake-Chunks": strconv.Itoa(5 + r.IntN(200))}
	var wg sync.WaitGroup
	for range 2 {
		r2 := rand.New(rand.NewPCG(r.Uint64(), 23))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := c.call(ctx, r2, callRec{kind: "dup", user: u, caller: n}, body, hdr, -1)
			if rec.transport || rec.status >= 500 {
				time.Sleep(time.Duration(r2.IntN(500)) * time.Millisecond)
				c.call(ctx, r2, callRec{kind: "dup", user: u, caller: n}, body, hdr, -1)
			}
		}()
	}
	wg.Wait()
}

// operatorLoop, under plan.operator, runs the operator's forced reconcile pass every 0.5–1.5 s
// while the traffic runs: a pass that takes no lock, beside the processes' reconcilers, that
// settles what has expired and has no lease (a failed pass is logged: Redis may be down).
func (c *chaos) operatorLoop(ctx context.Context) {
	if !c.plan.operator {
		return
	}
	r := rand.New(rand.NewPCG(uint64(c.seed), 94))
	w := c.w
	for passes := 0; ; passes++ {
		select {
		case <-ctx.Done():
			c.t.Logf("operator's forced passes during the traffic: %d", passes)
			return
		case <-time.After(time.Duration(500+r.IntN(1000)) * time.Millisecond):
		}
		cmd := testenv.DiesWithTests(exec.Command(gatewayBin, "reconcile", "-once", "-force", "-config", w.config))
		cmd.Env = append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+w.redisURL, "UPSTREAM_URL="+w.upstream.URL,
			"TOLLGATE_INSTANCE=operator", "TOLLGATE_REDIS_PREFIX="+w.prefix)
		if out, err := cmd.CombinedOutput(); err != nil {
			c.t.Logf("operator's forced pass at %s: %v\n%s", clock(time.Now()), err, tail(out, 2000))
		}
	}
}
