package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// TestChaosRedisPartition is the chaos run with one of the two gateways cut off from Redis now
// and then, for several lease TTLs (past the Redis timeouts too), while the other gateway and
// the database stay reachable: a network partition, not a Redis outage. Gateway 0
// reaches Redis through a relay (freezer) that, by turns, drops every byte both ways without a
// reset (what a blackholed route does; TCP delivers what was held back when it heals) and
// resets every connection, new ones too (a firewall's reject). No process is killed. After the
// traffic the books are audited by TestChaosExactlyOnce's rules, and:
//
//   - no call is cut off without an answer (no process dies here) and none is answered 500;
//   - the cut-off gateway refuses only as README says (503 billing_unavailable or
//     dedup_unavailable for what needs Redis on the caller's path), and serves again without a
//     restart once the partition heals: an Idempotency-Key call, a named run's call and a
//     session's message on it each get their whole answer;
//   - outside a cut, either gateway refuses only a call one of whose steps ran out of its
//     deadline while the test itself saw the box stall (CI's two cores run the packages side
//     by side): README's 503 for a database too slow for admit_timeout (lateInAStall).
//
// The holds live partitionHoldTTL here, not testHoldTTL, in the proportion of the defaults: a
// hold outlasts its call and every Redis deadline that call can wait out (2 s a step) by far,
// while the leases lapse within a partition. No call outlives its hold, so none is exempt from
// the audit: a run of the cut-off process settled by the other's reconciler while its call
// ran is a failure here. (A call that outlives its hold while its process is cut off is README
// "Known limits"; outlivedHoldAcrossCut exempts it should one be sent.) CHAOS_CUTS sets how
// many partitions (default 2).
func TestChaosRedisPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: not in -short")
	}
	w := newWorld(t)
	relay := newFreezer(t, w.redisAddr())
	// A process cut off from Redis alone still beats in the database: a dead-instance bound
	// as short as a partition must not take it for dead (waitDeadSwept checks none was).
	runChaosPlan(t, w, 30*time.Second, chaosPlan{cuts: relay, holdTTL: partitionHoldTTL, deadAfter: partitionFor})
}

// partitionHoldTTL is the hold_ttl and run_ttl of TestChaosRedisPartition: over twice its
// longest call (a stream of 400 events 15 ms apart) with a Redis deadline at each of its steps.
const partitionHoldTTL = 20 * time.Second

// partitionFor is how long one partition lasts: three lease TTLs, so that the cut-off process's
// leases lapse and the other process's reconciler passes over its holds while they are gone.
const partitionFor = 3*testLeaseTTL + testReconcile

// partitionLoop cuts gateway 0 off from Redis (plan.cuts) n times (CHAOS_CUTS, default 2),
// once in each n-th of the traffic's duration, for partitionFor each, dropping packets and
// resetting connections by turns, and heals each before the traffic stops.
func (c *chaos) partitionLoop(ctx context.Context, duration time.Duration) {
	f := c.plan.cuts
	if f == nil {
		return
	}
	n := envCount(c.t, "CHAOS_CUTS", 2)
	c.mu.Lock()
	c.cutsWanted = n
	c.mu.Unlock()
	r := rand.New(rand.NewPCG(uint64(c.seed), 97))
	slot := duration / time.Duration(n)
	if slot < partitionFor+2*time.Second {
		c.t.Errorf("traffic of %v leaves no room for %d partitions of %v", duration, n, partitionFor)
		return
	}
	start := time.Now()
	for k := range n {
		at := start.Add(time.Duration(k)*slot + time.Second + time.Duration(r.Int64N(int64(slot-partitionFor-2*time.Second))))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(at)):
		}
		// Read before the cut: a stall of the test between the two must not leave a moment of
		// the cut outside its window.
		from := time.Now()
		mode := "dropped"
		if k%2 == 1 {
			mode = "reset"
			f.cut()
		} else {
			f.freeze()
		}
		time.Sleep(partitionFor) // the traffic's end waits for the heal: ctx is not watched
		f.thaw()
		c.mu.Lock()
		c.cutOff = append(c.cutOff, [2]time.Time{from, time.Now()})
		c.mu.Unlock()
		c.t.Logf("gateway 0 cut off from Redis (packets %s) from %s to %s", mode, from.Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
	}
}

// recovered checks that gateway 0, the partition healed, serves what needs Redis on the
// caller's path again without a restart: an Idempotency-Key call, a named run's call and a
// session's message each get their whole answer (within recoverBound of the box's time: the
// first tries may meet a connection the partition left broken).
func (c *chaos) recovered() {
	r := rand.New(rand.NewPCG(uint64(c.seed), 96))
	start := time.Now()
	overdue := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return time.Since(start) > recoverBound+c.stalledFor(start, time.Now())
	}
	for _, kind := range []string{"idem", "run", "session"} {
		for try := 0; ; try++ {
			name := fmt.Sprintf("healed-%d-%s-%d", c.seed, kind, try)
			rec := callRec{kind: kind, caller: 0, user: 0, slot: 0, pinned: true}
			hdr := map[string]string{"X-Fake-Chunks": "5"}
			switch kind {
			case "idem":
				rec.key, hdr["Idempotency-Key"] = name, name
			case "run":
				rec.run, hdr["X-Run-Id"] = name, name
			case "session":
				rec.sess, hdr["X-Session-Id"] = name, name
			}
			rec = c.call(context.Background(), r, rec, c.body(r, false, 0, 1_000_000+try), hdr, -1)
			if rec.status == http.StatusOK && rec.complete {
				break
			}
			if overdue() {
				c.t.Errorf("gateway 0 after the partition healed: a %s call still answered %d %s (try %d, %v after the first, %v of it the box's stall)",
					kind, rec.status, rec.code, try, time.Since(start).Round(time.Millisecond), c.stalledForLocked(start).Round(time.Millisecond))
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// recoverBound is how long recovered gives gateway 0 to serve again, stalls of the box (as
// watchStalls measures them) not counted: a stalled box's calls are late for its stall, not
// for the process (a MariaDB stopped 16 s as recovered began failed the fixed 15 s bound).
const recoverBound = 15 * time.Second

// cutRefusals are the refusals README documents for a process whose Redis is out of its reach.
var cutRefusals = []string{"billing_unavailable", "dedup_unavailable"}

// lagFloor is the least lateness of a stall watch round that stalledFor counts: under it, a
// round's PING and SELECT 1 taking their time.
const lagFloor = 20 * time.Millisecond

// stalledFor is how long the box stood still between from and to, as watchStalls measured it
// (the caller holds c.mu): what each of its rounds that overlaps the span took past its pause
// (lagFloor or more), the round under way counted as far as it has come.
func (c *chaos) stalledFor(from, to time.Time) time.Duration {
	var d time.Duration
	for _, l := range c.lags {
		if l[0].Before(to) && l[1].After(from) {
			d += l[1].Sub(l[0]) - watchPause
		}
	}
	if w := c.watching; !w.IsZero() && w.Before(to) {
		if late := time.Since(w) - watchPause; late >= lagFloor {
			d += late
		}
	}
	return d
}

// stalledForLocked is stalledFor from from to now, taking c.mu.
func (c *chaos) stalledForLocked(from time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stalledFor(from, time.Now())
}

// watchPause is the pause between two rounds of watchStalls.
const watchPause = 100 * time.Millisecond

// stallBound is how long one round of the test's own stall watch (watchStalls) must take past
// its pause for the box to count as stalled: half the shortest deadline a call waits on before
// it is forwarded (a Redis step's 2 s), most of the heartbeats' (testHeartbeat) twice over.
const stallBound = time.Second

// watchStalls measures, until ctx ends, whether the box stalls, from outside the gateways:
// every 100 ms the test asks Redis (directly, not through the relay) and the database each for
// a trivial answer, and records as a stall (c.stalled) each stretch from one round's end to the
// next's that took stallBound past its pause. The test's own process waiting for a CPU, Redis's
// or the database's, all count: what makes a gateway's steps late though nothing is cut off.
// (A run with two CPU hogs beside `go test -race` on two cores saw both gateways' heartbeats
// time out for 3 s and two admissions on gateway 0 run out of their admit_timeout 200 ms
// before the first cut.) A stall of one gateway alone is not seen: it cannot be told from
// that gateway's own fault.
func (c *chaos) watchStalls(ctx context.Context) {
	if c.plan.cuts == nil {
		return
	}
	const pause = watchPause
	last := time.Now()
	c.mu.Lock()
	c.watching = last
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.watching = time.Time{}
		c.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		// Not under ctx: the round that ctx's end interrupts would be recorded as an error.
		if err := c.w.rdb.Ping(context.Background()).Err(); err != nil {
			c.t.Errorf("stall watch: Redis PING: %v", err)
			return
		}
		if _, err := c.w.db.ExecContext(context.Background(), "SELECT 1"); err != nil {
			c.t.Errorf("stall watch: the database's SELECT 1: %v", err)
			return
		}
		now := time.Now()
		late := now.Sub(last) - pause
		c.mu.Lock()
		if late >= lagFloor {
			c.lags = append(c.lags, [2]time.Time{last, now})
		}
		if late >= stallBound {
			c.stalled = append(c.stalled, [2]time.Time{last, now})
		}
		c.watching = now
		c.mu.Unlock()
		if late >= stallBound {
			c.t.Logf("the box stalled from %s to %s", last.Format("15:04:05.000"), now.Format("15:04:05.000"))
		}
		last = now
	}
}

// refusalErrors reads the "request refused" lines of 503 in every log of both processes: the
// error behind each, by its request_id, or by "remote" for one refused before it had an id
// (its key's lookup), with when it was logged.
func (c *chaos) refusalErrors() map[string][]refusalLine {
	out := map[string][]refusalLine{}
	for i := range c.slots {
		c.slots[i].mu.Lock()
		past := slices.Clone(c.slots[i].past)
		c.slots[i].mu.Unlock()
		for _, g := range past {
			b, err := os.ReadFile(g.log)
			if err != nil {
				c.t.Fatalf("log of gateway %s: %v", g.name, err)
			}
			for _, line := range bytes.Split(b, []byte("\n")) {
				var l struct {
					Msg       string  `json:"msg"`
					TS        float64 `json:"ts"`
					Status    int     `json:"status"`
					RequestID string  `json:"request_id"`
					Remote    string  `json:"remote"`
					Reason    string  `json:"reason"`
					Error     string  `json:"error"`
				}
				if json.Unmarshal(line, &l) != nil || l.Msg != "request refused" || l.Status != http.StatusServiceUnavailable {
					continue
				}
				id := l.RequestID
				if id == "" {
					id = "remote " + l.Remote
				}
				sec, frac := math.Modf(l.TS)
				out[id] = append(out[id], refusalLine{at: time.Unix(int64(sec), int64(frac*1e9)), reason: l.Reason, err: l.Error})
			}
		}
	}
	return out
}

// refusalLine is what a process logged of one 503 it answered.
type refusalLine struct {
	at          time.Time
	reason, err string
}

// deadlineSignatures are what the error of a refusal says when a step's deadline ran out, not
// a connection: the admission's start (holds.ErrAdmitNotStarted), the call's admit_timeout
// (proxy's errAdmitBudgetSpent), any other step's own deadline. A stall makes steps late; it
// does not break a connection (EOF, a reset, a broken pipe: only a cut does).
var deadlineSignatures = []string{holds.ErrAdmitNotStarted.Error(), "admit_timeout spent before forwarding", context.DeadlineExceeded.Error()}

// lateInAStall says whether a 503 outside every cut is the box's stall's, not a fault of the
// process (the caller holds c.mu): the process logged it as a step whose deadline ran out,
// and the test's own stall watch saw the box stalled while the call waited. Anything else
// fails the audit: a refusal for a broken connection, a refusal without its log line, or a
// late step while the box was not seen stalled (a process stuck on its own, say).
func (c *chaos) lateInAStall(rec callRec, refused map[string][]refusalLine) (string, bool) {
	if !slices.ContainsFunc(c.stalled, func(w [2]time.Time) bool { return w[0].Before(rec.ended) && w[1].After(rec.sent) }) {
		return "", false
	}
	id := rec.requestID
	if id == "" {
		id = "remote " + rec.local
	}
	for _, l := range refused[id] {
		// A remote address may be used again by a later call: the line must be this call's.
		if rec.requestID == "" && (l.at.Before(rec.sent) || l.at.After(rec.ended)) {
			continue
		}
		if slices.ContainsFunc(deadlineSignatures, func(sig string) bool { return strings.Contains(l.err, sig) }) {
			return l.reason + ": " + l.err, true
		}
	}
	return "", false
}

// auditCuts checks what the callers saw on both processes against README: no call cut off
// without its answer (nothing was killed), no 500, and 503s only on the cut-off process, with
// a code README gives for Redis out of reach, and only while it was cut off (or its last
// Redis step's deadline after) — or, on either process, a step whose deadline ran out while
// the box stalled (lateInAStall), which README documents for a database too slow for a call's
// admit_timeout. Either way recovered has checked that gateway 0 serves again.
func (c *chaos) auditCuts() {
	t := c.t
	refused := c.refusalErrors()
	c.mu.Lock()
	defer c.mu.Unlock()
	during := func(rec callRec) bool {
		return slices.ContainsFunc(c.cutOff, func(w [2]time.Time) bool {
			return w[0].Before(rec.ended) && w[1].Add(5*time.Second).After(rec.sent)
		})
	}
	var excused int
	codes := map[string]int{}
	longest := map[string]time.Duration{} // how long the slowest 503 of each kind took
	for _, rec := range c.calls {
		what := fmt.Sprintf("%s call to gateway %d (run %s, sent %s, ended %s)", rec.kind, rec.slot, rec.runID,
			rec.sent.Format("15:04:05.000"), rec.ended.Format("15:04:05.000"))
		switch {
		case rec.transport && rec.code == "":
			// (A stream that ends with an error event, superseded say, was answered.)
			t.Errorf("%s: cut off without its answer (status %d, code %q), though no process was killed", what, rec.status, rec.code)
		case rec.status >= 500 && rec.status != http.StatusServiceUnavailable:
			t.Errorf("%s: answered %d %s", what, rec.status, rec.code)
		case rec.status == http.StatusServiceUnavailable:
			codes[fmt.Sprintf("%d:%s", rec.slot, rec.code)]++
			k := rec.kind + ":" + rec.code
			longest[k] = max(longest[k], rec.ended.Sub(rec.sent).Round(time.Millisecond))
			switch {
			case !slices.Contains(cutRefusals, rec.code):
				t.Errorf("%s: refused 503 %s (cut off then: %v)", what, rec.code, during(rec))
			case rec.slot == 0 && during(rec):
				// README's refusal of a process cut off from Redis.
			default:
				if why, ok := c.lateInAStall(rec, refused); ok {
					excused++
					t.Logf("%s: refused 503 %s outside a cut, while the box stalled: %s", what, rec.code, why)
				} else {
					t.Errorf("%s: refused 503 %s (cut off then: %v; box stalled then, by a deadline: no)", what, rec.code, during(rec))
				}
			}
		}
	}
	t.Logf("CHAOS partitions: %d; 503s by gateway and code: %v (%d of them outside a cut, in the box's %d stalls); the slowest by kind of call: %v",
		len(c.cutOff), codes, excused, len(c.stalled), longest)
}

// envCount reads a count of at least 1 from the environment variable name, def when unset.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s: %q is not a count of at least 1", name, v)
	}
	return n
}
