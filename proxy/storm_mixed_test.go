package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// TestMixedStormChargesEachCallOnce runs every way of calling the gateway at once, for a few
// seconds, from many clients of a few users with small balances: plain calls (streamed or not,
// chat, Anthropic messages and Responses), the same body sent again at once and later (the
// fingerprint window), Idempotency-Key requests retried concurrently, after they finished and
// after a client left one, session calls that repeat or replace the session's running message,
// named runs of several calls (some concurrent) settled with POST /v1/runs/{id}/settle or left
// to expire and be reconciled (a reconciler and the lease heartbeat run throughout, with a
// short run_ttl), and clients that leave before or in the middle of a stream. Each client
// picks its moves from a seeded generator (the seed is logged; STORM_SEED replays the choices
// — the interleaving is the scheduler's, so a replay is likely, not certain, to fail the same
// way).
//
// Afterwards it asserts what must hold whatever the interleaving was: no 5xx and no transport
// error the client did not cause; no live hold; the day ledger equals the settled charges;
// every charge is the discounted cost of the run's usage clamped to its cap, and every answer
// that showed its usage was billed exactly that usage (a named run: the sum of its calls');
// every upstream call is counted in exactly one settled run; every 2xx answer that is not a
// replay belongs to a run of its own that was charged, and a replay repeats a charged answer
// byte for byte; and no user is charged beyond their balance by more than the design's bounded
// overdraft allows. Nothing about timing is asserted.
func TestMixedStormChargesEachCallOnce(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STORM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("STORM_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("storm seed %d (replay with STORM_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5707))

	const (
		load     = 5 * time.Second
		planName = "storm"
	)
	h := newHarness(t, func(c *config.Config) {
		// Small holds and caps, so that calls often cost more than they hold and a balance of
		// a few dozen credits runs out within the storm.
		c.Plans[planName] = config.Plan{AllowanceCredits: config.CreditsOf(30), HoldNormalCredits: config.CreditsOf(1),
			HoldHeavyCredits: config.CreditsOf(3), HeavyAfterTurns: 3, MaxInFlight: 6, MaxRunCostCredits: config.CreditsOf(6)}
		// A named run left alone expires within the storm and is reconciled from its tally.
		// The lease TTL (also the reservations' stale window) is what a live call's beats may
		// miss before the reconciler or another call takes it for a dead process's: at 1 s a
		// loaded machine's storm under -race missed it (a running call's reservation "dropped
		// as stale"), and a lapsed lease would have let the reconciler settle a run under a
		// call still running. Nothing here kills a process, so nothing waits for a lapse.
		c.Holds.RunTTL, c.Holds.LeaseTTL, c.Holds.HeartbeatInterval = 1500*time.Millisecond, 3*time.Second, 300*time.Millisecond
	})
	ctx := context.Background()

	// Users: two that run dry early (one with prepaid credits on top), one at a discount, one
	// with room to spare. Balances in micro-USD.
	type stormUser struct {
		id      uint64
		key     string
		balance int64 // allowance + prepaid at the start
	}
	specs := []struct {
		allowance, prepaid int64
		discountBP         int
	}{
		{allowance: 15_000},
		{allowance: 30_000, prepaid: 10_000},
		{allowance: 400_000, discountBP: 2500},
		{allowance: 800_000},
	}
	nUsers := 3 + rng.IntN(2)
	users := make([]stormUser, nUsers)
	for i := range users {
		sp := specs[i]
		u, key := h.user(planName)
		allowance := sp.allowance
		var disc *int
		if sp.discountBP != 0 {
			d := sp.discountBP
			disc = &d
		}
		if err := h.store.SetUserLimits(ctx, u.ID, &allowance, nil, disc); err != nil {
			t.Fatal(err)
		}
		if sp.prepaid > 0 {
			if _, _, err := h.store.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: sp.prepaid,
				IdempotencyKey: "storm-" + testenv.RandomID(6), Reason: "storm"}); err != nil {
				t.Fatal(err)
			}
		}
		users[i] = stormUser{id: u.ID, key: key, balance: sp.allowance + sp.prepaid}
	}

	// The lease heartbeat and a reconciler, as a gateway process runs them.
	bg, stopBackground := context.WithCancel(ctx)
	var background sync.WaitGroup
	rec := holds.NewReconciler(holds.ReconcilerConfig{Store: h.store, Usage: tallyUsage{h.tally},
		Leases: stormLeases{rdb: h.rdb, keys: h.keys}, Lock: alwaysLocked{},
		Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), ExtendBy: h.cfg.Holds.HoldTTL, Interval: 200 * time.Millisecond})
	background.Add(2)
	go func() { defer background.Done(); h.leases.Run(bg) }()
	go func() { defer background.Done(); rec.Run(bg) }()
	stop := sync.OnceFunc(func() { stopBackground(); background.Wait() })
	t.Cleanup(stop)

	st := &storm{h: h, deadline: time.Now().Add(load)}
	nClients := 16 + rng.IntN(17)
	t.Logf("%d clients, %d users", nClients, nUsers)
	var wg sync.WaitGroup
	for ci := range nClients {
		c := &stormClient{st: st, id: ci, rng: rand.New(rand.NewPCG(seed, uint64(ci)+1))}
		tr := &http.Transport{MaxIdleConnsPerHost: 8}
		c.hc.Transport = tr
		t.Cleanup(tr.CloseIdleConnections)
		c.user, c.key = ci%nUsers, users[ci%nUsers].key
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(st.deadline) {
				c.step()
			}
		}()
	}
	wg.Wait()
	stop()
	h.settled()

	// Every named run still open is settled now (one left for later whose client's turn did not
	// come, one a settle found busy, one the reconciler extended).
	var open []struct {
		UserID uint64 `db:"user_id"`
		Name   string `db:"client_run_id"`
	}
	if err := h.db.Select(&open, "SELECT user_id, client_run_id FROM run_holds WHERE client_run_id IS NOT NULL AND state <> 'settled'"); err != nil {
		t.Fatal(err)
	}
	keyOf := map[uint64]string{}
	for _, u := range users {
		keyOf[u.id] = u.key
	}
	for _, r := range open {
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, body := h.settleRun(keyOf[r.UserID], r.Name)
			if status == http.StatusOK {
				break
			}
			if status != http.StatusConflict || time.Now().After(deadline) {
				t.Fatalf("settling run %s after the storm: %d %s", r.Name, status, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h.settled()

	st.mu.Lock()
	answers := st.answers
	st.mu.Unlock()
	logSummary(t, answers)
	for _, e := range st.errs {
		t.Error(e)
	}

	// No hold left live, and the books add up.
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d holds still live after the storm", live)
	}
	testenv.CheckLedger(t, h.db)

	var rows []holds.Run
	if err := h.db.Select(&rows, `SELECT run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro,
		charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok, calls, model,
		discount_bp, estimated, settle_source, expires_at, created_at, settled_at FROM run_holds`); err != nil {
		t.Fatal(err)
	}
	byID := map[string]holds.Run{}
	byName := map[string]holds.Run{}
	var upstreamCalls int64
	days := map[string]bool{}
	sources := map[string]int{}
	for _, r := range rows {
		byID[r.RunID] = r
		if r.ClientRunID.Valid {
			byName[r.ClientRunID.String] = r
		}
		upstreamCalls += int64(r.Calls)
		sources[r.SettleSource.String]++
		if r.SettledAt.Valid {
			days[r.SettledAt.Time.UTC().Format(time.DateOnly)] = true
		}
		// Every charge is the discounted cost of the usage, clamped to the cap.
		if r.ChargedMicro > r.CapMicro {
			t.Errorf("run %s charged %d over its cap %d", r.RunID, r.ChargedMicro, r.CapMicro)
		}
		if r.HeldMicro > r.CapMicro || r.HeldMicro <= 0 {
			t.Errorf("run %s held %d with a cap of %d", r.RunID, r.HeldMicro, r.CapMicro)
		}
		// Each call's cost is rounded up once (DESIGN §2): a named run's is the sum of its
		// calls', up to one µUSD a call above the cost of its summed tokens.
		if want := fakeGPTCost(r.InTok, r.OutTok); r.CostMicro < want || r.CostMicro > want+max(0, int64(r.Calls)-1) ||
			(!r.ClientRunID.Valid && r.CostMicro != want) || r.CacheReadTok != 0 || r.CacheWriteTok != 0 {
			t.Errorf("run %s: cost %d for %d in / %d out tokens in %d calls, want %d (source %s)", r.RunID, r.CostMicro,
				r.InTok, r.OutTok, r.Calls, want, r.SettleSource.String)
		}
		if want := min(pricing.ApplyDiscount(r.CostMicro, r.DiscountBP), r.CapMicro); r.ChargedMicro != want {
			t.Errorf("run %s: charged %d, want min(discounted cost %d, cap %d) = %d (source %s)", r.RunID, r.ChargedMicro,
				pricing.ApplyDiscount(r.CostMicro, r.DiscountBP), r.CapMicro, want, r.SettleSource.String)
		}
		switch r.SettleSource.String {
		case holds.SourceComplete, holds.SourceCancel, holds.SourceRelease, holds.SourceDuplicate:
		case holds.SourceClient, holds.SourceReconcile:
			if !r.ClientRunID.Valid {
				t.Errorf("one-call run %s settled as %s", r.RunID, r.SettleSource.String)
			}
		default:
			t.Errorf("run %s settled with source %q, which nothing in the storm should cause", r.RunID, r.SettleSource.String)
		}
		if (r.SettleSource.String == holds.SourceRelease || r.SettleSource.String == holds.SourceDuplicate) && (r.Calls != 0 || r.ChargedMicro != 0) {
			t.Errorf("run %s released as %s with %d calls, charged %d", r.RunID, r.SettleSource.String, r.Calls, r.ChargedMicro)
		}
	}
	t.Logf("settled runs by source: %v", sources)

	// Every 2xx answer that is not a replay is a run of its own, settled and charged, and billed
	// the usage it showed; a replay repeats a charged answer of its key.
	answered := map[string]*stormAnswer{} // one-call run id -> its 2xx answer
	explained := map[string]bool{}        // one-call runs answered otherwise: left, or superseded
	type namedTally struct {
		complete      int
		in, out, cost int64
		uncertain     bool // a call whose usage the client did not see whole
	}
	named := map[string]*namedTally{}
	leftEarly := 0   // attempts left before their run id was known
	wholeBilled := 0 // one-call runs answered whole, their billed usage compared with the answer's
	var replays []*stormAnswer
	for i := range answers {
		a := &answers[i]
		if a.op == opSettle {
			continue
		}
		if a.named {
			nt := named[a.runName]
			if nt == nil {
				nt = &namedTally{}
				named[a.runName] = nt
			}
			switch {
			case a.status >= 200 && a.status <= 299 && a.complete && a.usage.known:
				nt.complete++
				nt.in += a.usage.in
				nt.out += a.usage.out
				nt.cost += fakeGPTCost(a.usage.in, a.usage.out)
			case a.status == 0 || (a.status >= 200 && a.status <= 299):
				nt.uncertain = true
			}
		}
		switch {
		case a.cancelled && a.runID == "":
			leftEarly++
			continue
		case a.status < 200 || a.status > 299:
			if a.runID != "" && (a.code == "superseded" || a.cancelled) {
				explained[a.runID] = true
			}
			continue
		case a.replayed:
			replays = append(replays, a)
			continue
		case a.runID == "":
			t.Errorf("%s: 2xx answer without %s", a.op, proxy.RunIDHeader)
			continue
		}
		run, ok := byID[a.runID]
		if !ok {
			t.Errorf("%s: 2xx answer names run %s, which has no hold", a.op, a.runID)
			continue
		}
		if run.State != holds.StateSettled || run.ChargedMicro <= 0 || run.Calls <= 0 {
			t.Errorf("%s: 2xx answer of run %s: state %s, charged %d, %d calls", a.op, a.runID, run.State, run.ChargedMicro, run.Calls)
		}
		if a.named {
			continue
		}
		if prev := answered[a.runID]; prev != nil {
			t.Errorf("run %s answered 2xx twice, not as a replay: %s and %s", a.runID, prev.op, a.op)
			continue
		}
		answered[a.runID] = a
		if run.Calls != 1 {
			t.Errorf("%s: one-call run %s counts %d calls", a.op, a.runID, run.Calls)
		}
		switch {
		case a.complete:
			if run.SettleSource.String != holds.SourceComplete {
				t.Errorf("%s %s: run %s was answered whole but settled as %s", a.op, a.path, a.runID, run.SettleSource.String)
			}
			if a.usage.known && (a.usage.in != run.InTok || a.usage.out != run.OutTok) {
				t.Errorf("%s %s: run %s answered %d in / %d out tokens, billed %d / %d", a.op, a.path, a.runID,
					a.usage.in, a.usage.out, run.InTok, run.OutTok)
			} else if a.usage.known {
				wholeBilled++
			}
		case !a.cancelled && run.SettleSource.String != holds.SourceCancel:
			// An incomplete answer the client did not leave: superseded after its stream began.
			t.Errorf("%s: run %s answered incomplete (%q) but settled as %s", a.op, a.runID, a.code, run.SettleSource.String)
		}
	}
	for _, a := range replays {
		orig := answered[a.runID]
		run := byID[a.runID]
		switch {
		case orig == nil:
			t.Errorf("replay under key %q names run %s, which answered nobody 2xx", a.idemKey, a.runID)
		case orig.idemKey != a.idemKey:
			t.Errorf("replay under key %q names run %s of key %q", a.idemKey, a.runID, orig.idemKey)
		case run.SettleSource.String != holds.SourceComplete:
			t.Errorf("replay under key %q of run %s, settled as %s", a.idemKey, a.runID, run.SettleSource.String)
		case a.cancelled:
			// This client left the replay: what it read is a beginning of the stored answer.
			if orig.complete && !bytes.HasPrefix(orig.body, a.body) {
				t.Errorf("the replay of run %s a client left is not a beginning of its answer:\n%s\nwant a prefix of\n%s", a.runID, tail(a.body), tail(orig.body))
			}
		case orig.complete && !bytes.Equal(orig.body, a.body):
			t.Errorf("replay of run %s differs from its answer:\n%s\nwant\n%s", a.runID, tail(a.body), tail(orig.body))
		case !orig.complete && !bytes.HasPrefix(a.body, orig.body):
			// Its first client left after the answer was whole (the gateway's view) but before
			// it had read it all.
			t.Errorf("replay of run %s does not begin with what its first client read:\n%s\nwant a prefix\n%s", a.runID, tail(a.body), tail(orig.body))
		}
	}
	// A named run is charged what its calls used: exactly the usage they showed when every
	// call's answer was read whole, and at least that otherwise.
	exact, exactCharged := 0, 0
	for name, nt := range named {
		run, ok := byName[name]
		if !ok {
			if nt.complete > 0 {
				t.Errorf("named run %s answered %d calls and has no hold", name, nt.complete)
			}
			continue
		}
		if nt.uncertain {
			if run.Calls < nt.complete || run.InTok < nt.in || run.OutTok < nt.out || run.CostMicro < nt.cost {
				t.Errorf("named run %s (%s): tallied %d calls, %d in / %d out tokens, cost %d; its answers showed at least %d calls, %d / %d, cost %d",
					name, run.SettleSource.String, run.Calls, run.InTok, run.OutTok, run.CostMicro, nt.complete, nt.in, nt.out, nt.cost)
			}
			continue
		}
		exact++
		if run.Calls != nt.complete || run.InTok != nt.in || run.OutTok != nt.out || run.CostMicro != nt.cost {
			t.Errorf("named run %s (%s): tallied %d calls, %d in / %d out tokens, cost %d; its answers showed %d calls, %d / %d, cost %d",
				name, run.SettleSource.String, run.Calls, run.InTok, run.OutTok, run.CostMicro, nt.complete, nt.in, nt.out, nt.cost)
		} else if nt.complete > 0 {
			exactCharged++
		}
	}
	t.Logf("%d named runs, %d of them with every call's usage seen", len(named), exact)
	// Not vacuous: the rules above read "each answer seen is right", and a storm whose every
	// call was refused (402s and 409s are answers the clients accept) passed them all.
	if wholeBilled == 0 || len(replays) == 0 || exactCharged == 0 {
		t.Errorf("the storm checked too little: %d one-call answers whole and billed their usage, %d replays, %d named runs charged exactly their calls; want each > 0",
			wholeBilled, len(replays), exactCharged)
	}
	// The upstream calls of one-call runs that no 2xx answer accounts for were left by their
	// clients (or superseded): each is charged as a cancel.
	unexplained := 0
	for _, r := range rows {
		if r.ClientRunID.Valid || r.Calls == 0 || answered[r.RunID] != nil || explained[r.RunID] {
			continue
		}
		if r.SettleSource.String != holds.SourceCancel {
			t.Errorf("run %s reached the upstream, answered nobody 2xx and settled as %s", r.RunID, r.SettleSource.String)
		}
		unexplained++
	}
	if unexplained > leftEarly {
		t.Errorf("%d runs reached the upstream without a 2xx answer, only %d clients left before their answer began", unexplained, leftEarly)
	}
	// Every call the upstream saw is in exactly one settled run: none goes unbilled. The
	// other way there is a margin: a call whose client left (or whose session moved on) before
	// its answer began counts as sent once the gateway has written the whole request, and is
	// charged its prompt (README), but the connection may be closed before the upstream has
	// read it. Only such runs — one-call runs settled as a cancel with no 2xx answer — may
	// count a call the upstream never saw.
	mayBeUnseen := int64(0)
	for _, r := range rows {
		if !r.ClientRunID.Valid && r.Calls > 0 && answered[r.RunID] == nil && r.SettleSource.String == holds.SourceCancel {
			mayBeUnseen++
		}
	}
	if got := h.fake.Calls(); got > upstreamCalls || upstreamCalls > got+mayBeUnseen {
		t.Errorf("the upstream saw %d calls; the settled runs count %d (of which %d were left before their answer began)",
			got, upstreamCalls, mayBeUnseen)
	} else {
		t.Logf("the upstream saw %d calls; the settled runs count %d (%d left before their answer began)", got, upstreamCalls, mayBeUnseen)
	}

	// The bounded overdraft (DESIGN §3): what a user is charged beyond their balance is at most
	// Σ (cap − hold) over the calls in flight together when the balance ran out — at most
	// max_in_flight of them, so at most the largest max_in_flight values of (cap − hold).
	if len(days) > 1 {
		t.Logf("the storm straddled midnight UTC (%v): a second day's allowance; overdraft not checked", days)
		return
	}
	maxInFlight := h.cfg.Plans[planName].MaxInFlight
	for _, u := range users {
		var charged int64
		var slack []int64
		for _, r := range rows {
			if r.UserID != u.id {
				continue
			}
			charged += r.ChargedMicro
			slack = append(slack, r.CapMicro-r.HeldMicro)
		}
		sort.Slice(slack, func(i, j int) bool { return slack[i] > slack[j] })
		var bound int64
		for i := 0; i < len(slack) && i < maxInFlight; i++ {
			bound += slack[i]
		}
		b, err := h.store.Balance(ctx, u.id)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("user %d: balance %d, charged %d, over by %d (bound %d); prepaid now %d, held %d", u.id, u.balance, charged,
			max(0, charged-u.balance), bound, b.PrepaidMicro, b.HeldMicro)
		if charged-u.balance > bound {
			t.Errorf("user %d charged %d against a balance of %d: %d over, bound %d", u.id, charged, u.balance, charged-u.balance, bound)
		}
		if b.HeldMicro != 0 {
			t.Errorf("user %d still holds %d", u.id, b.HeldMicro)
		}
	}
}

// stormLeases is the reconciler's lease check, as cmd/gateway wires it.
type stormLeases struct {
	rdb  *redis.Client
	keys runstate.Keys
}

func (l stormLeases) Exists(ctx context.Context, runID string) (bool, error) {
	n, err := l.rdb.Exists(ctx, l.keys.Lease(runID)).Result()
	return n == 1, err
}

func logSummary(t *testing.T, answers []stormAnswer) {
	t.Helper()
	counts := map[string]int{}
	for _, a := range answers {
		k := fmt.Sprintf("%-8s %-22s %d", a.op, a.path, a.status)
		if a.code != "" {
			k += " " + a.code
		}
		if a.cancelled {
			k += " (left)"
		}
		if a.replayed {
			k += " (replay)"
		}
		counts[k]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %5d  %s", counts[k], k)
	}
	t.Logf("%d requests:%s", len(answers), b.String())
}

// storm is what the clients of TestMixedStormChargesEachCallOnce share.
type storm struct {
	h        *harness
	deadline time.Time
	mu       sync.Mutex
	answers  []stormAnswer
	errs     []string
}

type stormOp string

const (
	opPlain   stormOp = "plain"
	opDup     stormOp = "dup"
	opIdem    stormOp = "idem"
	opSession stormOp = "session"
	opNamed   stormOp = "named"
	opSettle  stormOp = "settle"
	opLeave   stormOp = "leave"
)

// stormRoute is a model route and the wire format of its answers.
type stormRoute struct {
	path   string
	format metering.Format
}

var (
	routeChat      = stormRoute{"/v1/chat/completions", metering.FormatChat}
	routeMessages  = stormRoute{"/v1/messages", metering.FormatAnthropic}
	routeResponses = stormRoute{"/v1/responses", metering.FormatResponses}
)

// stormUsage is the usage an answer showed its client.
type stormUsage struct {
	known   bool
	in, out int64
}

// stormAnswer is one request's end as its client saw it.
type stormAnswer struct {
	op        stormOp
	path      string
	user      int
	status    int
	code      string // error code, of an error answer or of an error event ending a stream
	runID     string
	replayed  bool
	complete  bool // a 2xx answer read to its end: the stream's final event, or a whole body
	cancelled bool // the client left before the end
	named     bool
	runName   string
	idemKey   string
	body      []byte // kept for idempotent answers
	usage     stormUsage
}

func (st *storm) record(a stormAnswer) {
	st.mu.Lock()
	st.answers = append(st.answers, a)
	st.mu.Unlock()
}

func (st *storm) fail(format string, args ...any) {
	st.mu.Lock()
	st.errs = append(st.errs, fmt.Sprintf(format, args...))
	st.mu.Unlock()
}

// stormClient is one caller: its own connection pool and its own seeded generator.
type stormClient struct {
	st   *storm
	id   int
	rng  *rand.Rand
	mu   sync.Mutex // rng, for the goroutines of one move
	user int
	key  string
	hc   http.Client
	runs int
	open []string // named runs left open, to settle later
}

func (c *stormClient) intn(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.IntN(n)
}

// stormReq is one request of a move.
type stormReq struct {
	op      stormOp
	route   stormRoute
	body    string
	hdr     map[string]string
	runName string
	idemKey string
	// leaveAfter: -1 reads the whole answer; n ≥ 0 leaves after n data lines of a stream.
	// leaveEarly: leaves after this pause, maybe before the answer begins.
	leaveAfter int
	leaveEarly time.Duration
}

// stormBody builds a request for rt; turns > 1 makes a conversation (heavy at 3 user turns).
func stormBody(rt stormRoute, text string, stream bool, maxTokens, turns int, includeUsage bool) string {
	var b strings.Builder
	switch rt.format {
	case metering.FormatAnthropic:
		b.WriteString(`{"model":"claude-test"`)
		if maxTokens <= 0 {
			maxTokens = 1024 // required by the Messages API
		}
	default:
		b.WriteString(`{"model":"fake-gpt"`)
	}
	if stream {
		b.WriteString(`,"stream":true`)
		if includeUsage && rt.format == metering.FormatChat {
			b.WriteString(`,"stream_options":{"include_usage":true}`)
		}
	}
	if maxTokens > 0 {
		field := "max_tokens"
		if rt.format == metering.FormatResponses {
			field = "max_output_tokens"
		}
		fmt.Fprintf(&b, `,%q:%d`, field, maxTokens)
	}
	if rt.format == metering.FormatResponses {
		b.WriteString(`,"input":[`)
	} else {
		b.WriteString(`,"messages":[`)
	}
	for i := 1; i < turns; i++ {
		fmt.Fprintf(&b, `{"role":"user","content":"earlier question %d"},{"role":"assistant","content":"earlier answer %d"},`, i, i)
	}
	fmt.Fprintf(&b, `{"role":"user","content":%q}]}`, text)
	return b.String()
}

// route picks a wire format: mostly chat.
func (c *stormClient) route() stormRoute {
	switch c.intn(5) {
	case 0:
		return routeMessages
	case 1:
		return routeResponses
	}
	return routeChat
}

// shape picks how long an answer is and how fast it comes, and perhaps an output bound.
func (c *stormClient) shape(stream bool) (map[string]string, int) {
	chunks := 3 + c.intn(40)
	switch r := c.intn(20); {
	case r == 0:
		chunks = 600 + c.intn(400) // costs more than any cap: clamped, or its bound lowered
	case r < 5:
		chunks = 50 + c.intn(250)
	}
	hdr := map[string]string{fakellm.HeaderChunks: strconv.Itoa(chunks)}
	if stream && c.intn(2) == 0 {
		hdr[fakellm.HeaderChunkInterval] = "1ms"
	}
	maxTokens := 0
	if c.intn(3) == 0 {
		maxTokens = 1 + c.intn(700)
	}
	return hdr, maxTokens
}

func (c *stormClient) step() {
	if len(c.open) > 0 && c.intn(3) == 0 {
		name := c.open[0]
		c.open = c.open[1:]
		c.settleSoon(name)
	}
	switch r := c.intn(100); {
	case r < 22:
		c.plain()
	case r < 32:
		c.duplicates()
	case r < 47:
		c.idempotent()
	case r < 64:
		c.session()
	case r < 82:
		c.named()
	default:
		c.leave()
	}
}

func (c *stormClient) text(pool int) string {
	return fmt.Sprintf("user %d question %d", c.user, c.intn(pool))
}

// plain: a call with no header of its own; its body comes from a small pool, so another
// client of the user may be sending it at the same moment (409 duplicate) or just after.
func (c *stormClient) plain() {
	rt := c.route()
	stream := c.intn(2) == 0
	hdr, mt := c.shape(stream)
	turns := 1
	if c.intn(6) == 0 {
		turns = 3
	}
	body := stormBody(rt, c.text(6), stream, mt, turns, c.intn(2) == 0)
	c.send(stormReq{op: opPlain, route: rt, body: body, hdr: hdr, leaveAfter: -1})
	if c.intn(4) == 0 {
		c.send(stormReq{op: opPlain, route: rt, body: body, hdr: hdr, leaveAfter: -1}) // asked again at once
	}
}

// duplicates: the same body two or three times at once.
func (c *stormClient) duplicates() {
	rt := c.route()
	stream := c.intn(2) == 0
	hdr, mt := c.shape(stream)
	body := stormBody(rt, c.text(1000), stream, mt, 1, c.intn(2) == 0)
	c.together(2+c.intn(2), func(int) { c.send(stormReq{op: opDup, route: rt, body: body, hdr: hdr, leaveAfter: -1}) })
}

// idempotent: a key from a pool of the user's (each key always with the same request), sent by
// one to three senders at once, then perhaps retried once the first answers. A sender
// sometimes leaves a stream early: the key is then free for a retry.
func (c *stormClient) idempotent() {
	k := c.intn(40)
	key := fmt.Sprintf("key-%d-%d", c.user, k)
	rt := []stormRoute{routeChat, routeChat, routeMessages, routeResponses}[k%4]
	stream := k%3 != 0
	body := stormBody(rt, fmt.Sprintf("idempotent %d of user %d", k, c.user), stream, 0, 1, k%2 == 0)
	hdr, _ := c.shape(stream)
	hdr[proxy.IdempotencyKeyHeader] = key
	send := func() {
		r := stormReq{op: opIdem, route: rt, body: body, hdr: hdr, idemKey: key, leaveAfter: -1}
		if stream && c.intn(6) == 0 {
			r.leaveAfter = c.intn(20)
		}
		c.send(r)
	}
	c.together(1+c.intn(3), func(int) { send() })
	if c.intn(2) == 0 {
		send()
	}
}

// session: a message in one of the user's three sessions, often with a second request close
// behind it: the same message (already_running while the first runs) or a new one (which
// supersedes it).
func (c *stormClient) session() {
	sid := fmt.Sprintf("sess-%d-%d", c.user, c.intn(3))
	stream := c.intn(3) != 0
	hdr, mt := c.shape(stream)
	hdr[proxy.SessionHeader] = sid
	usage := c.intn(2) == 0
	first := stormBody(routeChat, c.text(4), stream, mt, 1, usage)
	if c.intn(3) == 0 {
		c.send(stormReq{op: opSession, route: routeChat, body: first, hdr: hdr, leaveAfter: -1})
		return
	}
	// The first answer lasts long enough for the second request to find it running.
	hdr[fakellm.HeaderChunks] = strconv.Itoa(30 + c.intn(100))
	hdr[fakellm.HeaderChunkInterval] = "1ms"
	second := first
	if c.intn(2) == 0 {
		second = stormBody(routeChat, c.text(4), stream, mt, 1, usage)
	}
	pause := time.Duration(c.intn(30)) * time.Millisecond
	c.together(2, func(i int) {
		body := first
		if i == 1 {
			time.Sleep(pause)
			body = second
		}
		c.send(stormReq{op: opSession, route: routeChat, body: body, hdr: hdr, leaveAfter: -1})
	})
}

// named: a run of one to four calls, some at once, then settled on request, or left open for
// a later move (or the reconciler); sometimes one more call after the settle (409
// run_settled). Its streams ask for usage, so that what each call used is known.
func (c *stormClient) named() {
	c.runs++
	name := fmt.Sprintf("job-%d-%d", c.id, c.runs)
	call := func(i int) {
		stream := c.intn(2) == 0
		hdr, mt := c.shape(stream)
		hdr["X-Run-Id"] = name
		r := stormReq{op: opNamed, route: routeChat, body: stormBody(routeChat, fmt.Sprintf("step %d of %s", i, name), stream, mt, 1, true),
			hdr: hdr, runName: name, leaveAfter: -1}
		if stream && c.intn(8) == 0 {
			r.leaveAfter = c.intn(10)
		}
		c.send(r)
	}
	for i, n := 0, 1+c.intn(3); i < n; i++ {
		if c.intn(3) == 0 {
			c.together(2, func(j int) { call(10*i + j) })
		} else {
			call(10 * i)
		}
	}
	if c.intn(5) == 0 {
		// Left open: settled a few moves later, or abandoned to the reconciler, which
		// settles it from its tally once it expires (or after the storm, if it has not).
		// An open run keeps one of its user's in-flight slots.
		if c.intn(2) == 0 {
			c.open = append(c.open, name)
		}
		return
	}
	c.settleSoon(name)
	if c.intn(4) == 0 {
		call(99)
	}
}

// settleSoon settles a named run, trying again a few times while a call of it is in flight.
func (c *stormClient) settleSoon(name string) {
	for try := 0; try < 5; try++ {
		status, code := c.settle(name)
		if status != http.StatusConflict || code != "run_busy" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leave: a stream the client leaves, after n events or after a short pause.
func (c *stormClient) leave() {
	rt := c.route()
	hdr := map[string]string{fakellm.HeaderChunks: strconv.Itoa(100 + c.intn(300)), fakellm.HeaderChunkInterval: "2ms"}
	body := stormBody(rt, fmt.Sprintf("long story %d for user %d", c.intn(1_000_000), c.user), true, 0, 1, false)
	r := stormReq{op: opLeave, route: rt, body: body, hdr: hdr, leaveAfter: c.intn(40)}
	if c.intn(3) == 0 {
		r.leaveAfter, r.leaveEarly = -1, time.Duration(1+c.intn(15))*time.Millisecond
	}
	c.send(r)
}

// together runs n senders at once and waits for them.
func (c *stormClient) together(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// settle posts POST /v1/runs/{name}/settle and records the answer.
func (c *stormClient) settle(name string) (int, string) {
	req, _ := http.NewRequest(http.MethodPost, c.st.h.gw.URL+"/v1/runs/"+name+"/settle", nil)
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.hc.Do(req)
	if err != nil {
		c.st.fail("settle %s: %v", name, err)
		return 0, ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.st.fail("settle %s: reading the answer: %v", name, err)
	}
	a := stormAnswer{op: opSettle, user: c.user, status: resp.StatusCode, code: gjson.GetBytes(body, "error.code").String(), runName: name}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusNotFound && a.code == "run_not_found": // its first call was refused
	case resp.StatusCode == http.StatusConflict && a.code == "run_busy":
	default:
		c.st.fail("settle %s: %d %s", name, resp.StatusCode, body)
	}
	c.st.record(a)
	return resp.StatusCode, a.code
}

// send makes one request, reads (or leaves) its answer, checks its status and records it.
func (c *stormClient) send(r stormReq) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leftEarly := make(chan struct{})
	if r.leaveEarly > 0 {
		timer := time.AfterFunc(r.leaveEarly, func() { close(leftEarly); cancel() })
		defer timer.Stop()
	}
	isLeft := func() bool {
		select {
		case <-leftEarly:
			return true
		default:
			return false
		}
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.st.h.gw.URL+r.route.path, strings.NewReader(r.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	for k, v := range r.hdr {
		req.Header.Set(k, v)
	}
	a := stormAnswer{op: r.op, path: r.route.path, user: c.user, named: r.runName != "", runName: r.runName, idemKey: r.idemKey}
	resp, err := c.hc.Do(req)
	if err != nil {
		if isLeft() {
			a.cancelled = true
			c.st.record(a)
			return
		}
		c.st.fail("%s %s: %v", r.op, r.route.path, err)
		c.st.record(a)
		return
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	a.runID = resp.Header.Get(proxy.RunIDHeader)
	a.replayed = resp.Header.Get(proxy.ReplayedHeader) == "true"

	var buf bytes.Buffer
	if a.status == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		br := bufio.NewReader(resp.Body)
		events := 0
		for {
			line, err := br.ReadString('\n')
			buf.WriteString(line)
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				events++
				if streamEvent(r.route.format, []byte(data), &a) {
					a.complete = true
				}
				if r.leaveAfter >= 0 && events >= r.leaveAfter && !a.complete {
					a.cancelled = true
					cancel()
					break
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					if isLeft() {
						a.cancelled = true
					} else {
						c.st.fail("%s %s: run %s: reading the stream: %v", r.op, r.route.path, a.runID, err)
					}
				}
				break
			}
		}
		if a.complete && a.code != "" {
			c.st.fail("%s %s: run %s: a stream with its final event and an error event %q", r.op, r.route.path, a.runID, a.code)
		}
		if !a.complete && !a.cancelled && a.code != "superseded" {
			c.st.fail("%s %s: run %s: a stream that ended without its final event (%q):\n%s", r.op, r.route.path, a.runID, a.code, tail(buf.Bytes()))
		}
	} else {
		_, err := io.Copy(&buf, resp.Body)
		switch {
		case err != nil && isLeft():
			a.cancelled = true
		case err != nil:
			c.st.fail("%s %s: run %s: reading the answer: %v", r.op, r.route.path, a.runID, err)
		case a.status == http.StatusOK:
			a.complete = true
			u := gjson.GetBytes(buf.Bytes(), "usage")
			switch {
			case u.Get("prompt_tokens").Exists():
				a.usage = stormUsage{known: true, in: u.Get("prompt_tokens").Int(), out: u.Get("completion_tokens").Int()}
			case u.Get("input_tokens").Exists():
				a.usage = stormUsage{known: true, in: u.Get("input_tokens").Int(), out: u.Get("output_tokens").Int()}
			default:
				c.st.fail("%s %s: run %s: a 200 without usage: %s", r.op, r.route.path, a.runID, tail(buf.Bytes()))
			}
		default:
			a.code = gjson.GetBytes(buf.Bytes(), "error.code").String()
		}
	}
	if r.idemKey != "" && a.status == http.StatusOK {
		a.body = buf.Bytes()
	}
	if isLeft() && !a.complete {
		a.cancelled = true
	}
	c.check(r, &a, buf.Bytes())
	c.st.record(a)
	if a.status == http.StatusPaymentRequired || a.status == http.StatusTooManyRequests {
		time.Sleep(time.Duration(5+c.intn(20)) * time.Millisecond) // a refused client backs off
	}
}

// streamEvent reads one event's data into a: the usage it shows, an error it reports. It
// reports whether this is the stream's final event.
func streamEvent(f metering.Format, data []byte, a *stormAnswer) bool {
	data = bytes.TrimSpace(data)
	if f == metering.FormatChat {
		if string(data) == "[DONE]" {
			return true
		}
		if u := gjson.GetBytes(data, "usage"); u.IsObject() {
			a.usage = stormUsage{known: true, in: u.Get("prompt_tokens").Int(), out: u.Get("completion_tokens").Int()}
		}
		if code := gjson.GetBytes(data, "error.code"); code.Exists() {
			a.code = code.String()
		}
		return false
	}
	ev := gjson.ParseBytes(data)
	switch typ := ev.Get("type").String(); typ {
	case "message_start":
		u := ev.Get("message.usage")
		a.usage = stormUsage{known: true, in: u.Get("input_tokens").Int(), out: u.Get("output_tokens").Int()}
	case "message_delta":
		if out := ev.Get("usage.output_tokens"); out.Exists() {
			a.usage.out = out.Int()
		}
	case "message_stop":
		return true
	case "response.completed", "response.incomplete":
		u := ev.Get("response.usage")
		a.usage = stormUsage{known: u.IsObject(), in: u.Get("input_tokens").Int(), out: u.Get("output_tokens").Int()}
		return true
	case "error", "response.failed":
		a.code = ev.Get("code").String()
		if a.code == "" {
			a.code = "error:" + ev.Get("error.type").String()
		}
	}
	return false
}

// check fails an answer the request could not rightly get.
func (c *stormClient) check(r stormReq, a *stormAnswer, body []byte) {
	if a.cancelled && a.status == 0 {
		return
	}
	ok := false
	switch a.status {
	case http.StatusOK:
		ok = a.runID != ""
	case http.StatusPaymentRequired:
		ok = a.code == "insufficient_credits" || (a.named && a.code == "run_budget_exhausted")
	case http.StatusTooManyRequests:
		ok = a.code == "too_many_in_flight"
	case http.StatusConflict:
		switch a.code {
		case "duplicate":
			ok = r.op == opPlain || r.op == opDup
		case "request_in_progress":
			ok = r.idemKey != ""
		case "already_running", "superseded":
			ok = r.op == opSession
		case "run_settled":
			ok = a.named
		}
	}
	if !ok {
		c.st.fail("%s %s (user %d): status %d code %q run %q: %s", r.op, r.route.path, c.user, a.status, a.code, a.runID, tail(body))
	}
}

func tail(b []byte) []byte { return b[max(0, len(b)-400):] }
