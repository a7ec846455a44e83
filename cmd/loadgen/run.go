package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// Target is one way of reaching fakellm.
type Target struct {
	Name string // direct | plain | tollgate
	URL  string
	Pid  int // the process whose RSS is sampled (fakellm for direct)
}

// Run is one scenario against one target in one round.
type Run struct {
	Scenario   string             `json:"scenario"`
	Target     string             `json:"target"`
	Round      int                `json:"round"`
	Requests   int                `json:"requests"`
	OK         int                `json:"ok"`
	Errors     map[string]int     `json:"errors,omitempty"`
	WallSec    float64            `json:"wall_seconds"`
	Cut        int                `json:"cut,omitempty"` // unanswered 10 s after the time was up: not in Requests
	RPS        float64            `json:"rps"`
	Latency    Dist               `json:"latency"`
	TTFB       *Dist              `json:"ttfb,omitempty"`
	Streams    *StreamCheck       `json:"streams,omitempty"`
	RSSMaxMB   float64            `json:"rss_max_mb"`
	CPUCores   map[string]float64 `json:"cpu_cores"`
	Ledger     *Ledger            `json:"ledger,omitempty"`
	SettleLag  *Dist              `json:"settle_lag,omitempty"`
	LagMissing int                `json:"settle_lag_missing,omitempty"`
	// SettleCommit: the gateway's own tollgate_settle_seconds over the run (a call's end to
	// its settlement committed). settled_at is read when the batch transaction begins, so
	// SettleLag misses the transaction; this does not (bucket-interpolated, an estimate).
	SettleCommit *PhaseDist `json:"settle_commit,omitempty"`
	Balance      *Balance   `json:"balance,omitempty"`
	Profiles     []string   `json:"profiles,omitempty"`
	// DBPerRequest: MariaDB status counters per request of a tollgate run (the database is
	// shared by nothing else during the bench): statements, commits, fsyncs, row-lock waits.
	DBPerRequest map[string]float64 `json:"db_per_request,omitempty"`
	// GatewayPhases: where a tollgate run's calls waited before their answers started, from
	// the gateway's own histogram (auth, body, admit, checks, upstream, first_event); see phases.go.
	GatewayPhases map[string]PhaseDist `json:"gateway_phases,omitempty"`
	LoadAvg       string               `json:"loadavg_before"`

	lat, ttfb []float64
}

// StreamCheck counts what the order/loss check found.
type StreamCheck struct {
	Streams   int `json:"streams"`
	Lost      int `json:"lost_events"`
	Reordered int `json:"reordered_streams"`
	NoDone    int `json:"without_done"`
}

// scenario is one row of the table.
type scenario struct {
	name    string
	only    string // run against this target only ("" = all three)
	warm    load   // not recorded
	load    load
	profSec int // CPU/alloc profile length in seconds of the tollgate run (0: none)
	lag     bool
	drain   bool
}

type runner struct {
	keys     Keys
	targets  []Target
	db       *sqlx.DB
	pids     map[string]int
	pprof    string
	profDir  string
	outDir   string // the results file's directory: profiles are named relative to it
	stamp    string
	clients  map[string]*http.Client
	runs     []*Run
	profiled map[string]bool
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	keysPath := fs.String("keys", "keys.json", "keys written by setup")
	direct := fs.String("direct", "http://127.0.0.1:9090", "fakellm URL")
	plain := fs.String("plain", "http://127.0.0.1:9191", "plainproxy URL")
	gateway := fs.String("gateway", "http://127.0.0.1:8080", "tollgate URL")
	dsn := fs.String("dsn", os.Getenv("MYSQL_DSN"), "MySQL DSN (ledger, settlement lag and balance checks)")
	pidList := fs.String("pids", "", "name=pid,... of fakellm, plain, gateway (RSS) and mysql, redis (CPU)")
	rounds := fs.Int("rounds", 2, "rounds of direct -> plain -> tollgate per scenario")
	only := fs.String("scenarios", "", "comma-separated scenario names (default: all)")
	scale := fs.Float64("scale", 1, "multiply durations and counts (0.2 for a smoke run)")
	out := fs.String("out", "", "JSON results file")
	pprofURL := fs.String("pprof", "", "pprof base URL of the gateway (gateway serve -pprof): profile round 1 of each tollgate scenario")
	profDir := fs.String("profile-dir", "", "where profiles go (default: next to -out)")
	dbSteps := fs.String("db-steps", "", "output of `go test -bench BenchmarkDB ./holds/` to report with the scenarios")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r := &runner{clients: map[string]*http.Client{}, pids: parsePids(*pidList), pprof: strings.TrimSuffix(*pprofURL, "/"),
		profDir: *profDir, stamp: time.Now().UTC().Format("20060102T150405Z"), profiled: map[string]bool{}}
	raw, err := os.ReadFile(*keysPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &r.keys); err != nil {
		return fmt.Errorf("%s: %w", *keysPath, err)
	}
	r.targets = []Target{{"direct", *direct, r.pids["fakellm"]}, {"plain", *plain, r.pids["plain"]}, {"tollgate", *gateway, r.pids["gateway"]}}
	ctx := context.Background()
	if r.db, err = holds.Open(ctx, *dsn); err != nil {
		return err
	}
	defer r.db.Close()
	if *out != "" {
		r.outDir = filepath.Dir(*out)
		if r.profDir == "" {
			r.profDir = filepath.Join(r.outDir, "profiles-"+r.stamp)
		}
	}

	t0 := time.Now()
	if err := r.playAll(ctx, scenarios(r.keys, *scale), wanted(*only), *rounds); err != nil {
		return err
	}
	rep := report(r.runs)
	rep.Started = r.stamp
	rep.WallSeconds = round2(time.Since(t0).Seconds())
	rep.Host = hostInfo()
	if *dbSteps != "" {
		if rep.DBSteps, err = readDBSteps(*dbSteps); err != nil {
			return err
		}
	}
	printReport(os.Stdout, rep)
	if *out != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			return err
		}
		fmt.Printf("\nresults: %s\n", *out)
	}
	return failedCorrectness(rep)
}

// playAll plays each wanted scenario (all when want is empty) for its rounds, each round
// against every target in turn: direct, plain, tollgate, alternating so that a slow minute
// falls on all three.
func (r *runner) playAll(ctx context.Context, all []scenario, want map[string]bool, rounds int) error {
	for _, sc := range all {
		if len(want) > 0 && !want[sc.name] {
			continue
		}
		n := rounds
		if sc.only != "" {
			n = 1
		}
		for round := 1; round <= n; round++ {
			for _, t := range r.targets {
				if sc.only != "" && sc.only != t.Name {
					continue
				}
				run, err := r.play(ctx, sc, t, round)
				if err != nil {
					return fmt.Errorf("%s/%s: %w", sc.name, t.Name, err)
				}
				r.runs = append(r.runs, run)
				fmt.Fprintf(os.Stderr, "loadgen: %-14s %-8s round %d: %6d req %6.0f req/s p50 %6.2f ms p99 %7.2f ms errors %d cut %d%s\n",
					sc.name, t.Name, round, run.Requests, run.RPS, run.Latency.P50, run.Latency.P99, run.Requests-run.OK, run.Cut, extra(run))
			}
		}
	}
	return nil
}

// parsePids reads -pids (name=pid,...); loadgen itself is always "loadgen".
func parsePids(list string) map[string]int {
	pids := map[string]int{}
	for _, kv := range strings.Split(list, ",") {
		if name, v, ok := strings.Cut(kv, "="); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				pids[name] = pid
			}
		}
	}
	pids["loadgen"] = os.Getpid()
	return pids
}

// wanted is the set of scenario names -scenarios lists; empty for all.
func wanted(only string) map[string]bool {
	want := map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	return want
}

// failedCorrectness fails the run on a failed correctness check. Speed targets may be missed
// and the run still be worth keeping; a wrong ledger, an admission beyond the balance or a
// broken stream is a failure of the run.
func failedCorrectness(rep *Report) error {
	var failed []string
	for _, c := range rep.Checks {
		if !c.Pass && correctness(c) {
			failed = append(failed, c.Scenario+": "+c.What)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("correctness checks failed: %s", strings.Join(failed, "; "))
	}
	return nil
}

// correctness tells the checks that must never fail from the speed targets.
func correctness(c Check) bool {
	return c.Scenario == "all" || c.Scenario == "hot-drain" || strings.HasPrefix(c.What, "events lost")
}

// extra is the tail of a round's progress line: what the run measured beyond its latency,
// and the load average it started at.
func extra(run *Run) string {
	var s []string
	if run.TTFB != nil {
		s = append(s, fmt.Sprintf("ttfb p99 %.2f ms", run.TTFB.P99))
	}
	if run.Streams != nil {
		s = append(s, fmt.Sprintf("lost %d reordered %d", run.Streams.Lost, run.Streams.Reordered))
	}
	if run.RSSMaxMB > 0 {
		s = append(s, fmt.Sprintf("rss %.0f MB", run.RSSMaxMB))
	}
	if run.Ledger != nil {
		s = append(s, fmt.Sprintf("ledger pass=%v (drain %.2fs)", run.Ledger.Pass, run.Ledger.DrainSeconds))
	}
	if run.SettleLag != nil {
		s = append(s, fmt.Sprintf("settle lag p50 %.1f p99 %.1f ms", run.SettleLag.P50, run.SettleLag.P99))
	}
	if run.SettleCommit != nil {
		s = append(s, fmt.Sprintf("end -> commit p50 %.1f p99 %.1f ms", run.SettleCommit.P50, run.SettleCommit.P99))
	}
	if q := run.DBPerRequest; q != nil {
		s = append(s, fmt.Sprintf("per req: %.1f stmts %.1f commits %.2f fsyncs %.2f lock waits %.2f ms lock time",
			q["questions"], q["com_commit"], q["innodb_data_fsyncs"], q["innodb_row_lock_waits"], q["innodb_row_lock_time"]))
	}
	if p := run.GatewayPhases; p != nil {
		var parts []string
		for _, name := range phaseNames {
			if d, ok := p[name]; ok {
				parts = append(parts, fmt.Sprintf("%s %.2f/%.2f", name, d.P50, d.P99))
			}
		}
		s = append(s, "gateway phases p50/p99 ms: "+strings.Join(parts, " "))
	}
	s = append(s, "load "+run.LoadAvg)
	if run.Balance != nil {
		s = append(s, fmt.Sprintf("balance pass=%v admitted %d refused402 %d", run.Balance.Pass, run.Balance.Admitted, run.Balance.Refused402))
	}
	return "; " + strings.Join(s, "; ")
}

// scenarios are the table. Every load is bounded in time and, where it makes sense,
// in count.
func scenarios(k Keys, scale float64) []scenario {
	dur := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	cnt := func(n int) int { return max(1, int(float64(n)*scale)) }
	users := len(k.Users)
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	// One caller with one key (the hot user: its max_in_flight leaves room for settlements
	// that finish after the response).
	one := func(key string) func(w, j int) reqSpec {
		return func(w, j int) reqSpec { return reqSpec{key: key, body: chatBody(tag+"1", w, j, false)} }
	}
	// Each connection owns the users u ≡ w (mod conns): a user never has more calls in
	// flight than one, however settlements lag.
	owned := func(conns int, stream bool, hdr map[string]string, chunks int) func(w, j int) reqSpec {
		return func(w, j int) reqSpec {
			mine := (users - w + conns - 1) / conns
			u := w + conns*(j%max(1, mine))
			return reqSpec{key: k.Users[u%users], body: chatBody(tag, w, j, stream), stream: stream, headers: hdr, chunks: chunks}
		}
	}
	hot := func(key string) func(w, j int) reqSpec {
		return func(w, j int) reqSpec { return reqSpec{key: key, body: chatBody(tag+"h", w, j, false)} }
	}
	lat20 := map[string]string{"X-Fake-Latency": "20ms"}
	streamHdr := map[string]string{"X-Fake-Chunks": "200", "X-Fake-Chunk-Interval": "10ms"}
	busy := map[string]string{"X-Fake-Latency": "50ms", "X-Fake-Chunks": "20", "X-Fake-Chunk-Interval": "5ms"}
	return []scenario{
		{name: "latency-1conn",
			warm:    load{conns: 1, maxPerWorker: cnt(300), d: dur(30), spec: one(k.Hot)},
			load:    load{conns: 1, maxPerWorker: cnt(3000), d: dur(30), spec: one(k.Hot)},
			profSec: 3},
		{name: "users-256",
			warm:    load{conns: 256, maxPerWorker: 2, d: dur(10), spec: owned(256, false, lat20, 0)},
			load:    load{conns: 256, d: dur(8), maxTotal: int64(cnt(400_000)), spec: owned(256, false, lat20, 0)},
			profSec: 6},
		{name: "hot-64",
			warm:    load{conns: 64, maxPerWorker: 4, d: dur(10), spec: hot(k.Hot)},
			load:    load{conns: 64, d: dur(8), maxTotal: int64(cnt(400_000)), spec: hot(k.Hot)},
			profSec: 6},
		{name: "hot-drain", only: "tollgate", drain: true,
			load: load{conns: 64, d: dur(20), maxTotal: int64(cnt(50_000)), spec: hot(k.Drain),
				stopWorker: drainStop()}},
		// 512 streams in flight: every connection opened by the warm-up, each worker's first
		// stream starting at its slot within one stream's length (200 × 10 ms), then back to back.
		{name: "streams-512",
			warm:    load{conns: 512, maxPerWorker: 1, d: dur(10), spec: owned(512, true, map[string]string{"X-Fake-Chunks": "2"}, 2)},
			load:    load{conns: 512, maxPerWorker: 3, d: dur(30), stagger: 2 * time.Second, spec: streams512(k, tag, streamHdr)},
			profSec: 4},
		// The same 512 streams all started in one instant: no target, it shows what a thundering
		// herd costs each of the three ways.
		{name: "streams-burst",
			warm:    load{conns: 512, maxPerWorker: 1, d: dur(10), spec: owned(512, true, map[string]string{"X-Fake-Chunks": "2"}, 2)},
			load:    load{conns: 512, maxPerWorker: 1, d: dur(30), spec: streams512(k, tag+"b", streamHdr)},
			profSec: 4},
		{name: "settle-lag", only: "tollgate", lag: true,
			warm:    load{conns: 256, maxPerWorker: 1, d: dur(10), spec: owned(256, true, busy, 20)},
			load:    load{conns: 256, d: dur(8), maxTotal: int64(cnt(200_000)), spec: owned(256, true, busy, 20)},
			profSec: 6},
	}
}

// streams512: worker w streams as user w, then as user (w+512) mod users.
func streams512(k Keys, tag string, hdr map[string]string) func(w, j int) reqSpec {
	return func(w, j int) reqSpec {
		u := (w + 512*j) % len(k.Users)
		return reqSpec{key: k.Users[u], body: chatBody(tag+"s", w, j, true), stream: true, headers: hdr, chunks: 200}
	}
}

// drainStop ends a worker of the drain scenario once it has been refused for credits many
// times in a row: the balance is spent.
func drainStop() func(w int, s sample) bool {
	streak := make([]int, 4096)
	return func(w int, s sample) bool {
		if s.status == http.StatusPaymentRequired {
			streak[w]++
			time.Sleep(5 * time.Millisecond)
		} else {
			streak[w] = 0
		}
		return streak[w] >= 40
	}
}

func (r *runner) client(name string, conns int) *http.Client {
	key := name + "/" + strconv.Itoa(conns)
	if c, ok := r.clients[key]; ok {
		return c
	}
	c := newClient(conns)
	r.clients[key] = c
	return c
}

// play runs one round of scenario sc against t: its warm-up, its load under the process
// watch (and the profiler, once per scenario), and the checks of what it answered.
func (r *runner) play(ctx context.Context, sc scenario, t Target, round int) (*Run, error) {
	c := r.client(t.Name, max(sc.load.conns, sc.warm.conns))
	if sc.warm.conns > 0 {
		sc.warm.run(c, t.URL)
		if t.Name == "tollgate" {
			if _, _, err := waitSettled(ctx, r.db, 30*time.Second); err != nil {
				return nil, err
			}
		}
	}
	run := &Run{Scenario: sc.name, Target: t.Name, Round: round, Errors: map[string]int{}}
	var profDone chan []string
	if t.Name == "tollgate" && r.pprof != "" && sc.profSec > 0 && !r.profiled[sc.name] {
		r.profiled[sc.name] = true
		profDone = make(chan []string, 1)
		go func() { profDone <- r.profile(sc.name, sc.profSec) }()
		time.Sleep(100 * time.Millisecond)
	}
	run.LoadAvg = loadavg()
	var before map[string]float64
	var phasesBefore map[string]*histogram
	if t.Name == "tollgate" {
		before = dbCounters(ctx, r.db)
		phasesBefore = readPhases(ctx, t.URL)
	}
	pw := watch(t.Pid, r.pids)
	res := sc.load.run(c, t.URL)
	run.RSSMaxMB, run.CPUCores = pw.done()
	if profDone != nil {
		run.Profiles = <-profDone
	}
	run.WallSec = round3(res.wall.Seconds())
	ans := run.count(res.samples)
	// A load ended by its time: answers completed by the deadline over the load's time (the
	// requests in flight then finish and are kept for latency, not for throughput).
	run.Cut = res.cut
	run.RPS = round2(float64(run.OK) / res.wall.Seconds())
	if res.timeUp {
		done := 0
		for _, s := range res.samples {
			if s.ok && !s.end.After(res.deadline) {
				done++
			}
		}
		run.RPS = round2(float64(done) / sc.load.d.Seconds())
	}
	run.Latency = distOf(run.lat)
	if len(run.ttfb) > 0 {
		d := distOf(run.ttfb)
		run.TTFB = &d
	}
	if sc.drain {
		b, err := r.checkDrain(ctx, res.samples)
		if err != nil {
			return nil, err
		}
		run.Balance = &b
		// 402 is this scenario's expected answer, not an error of the gateway.
		delete(run.Errors, "status 402")
	}
	if t.Name == "tollgate" {
		if err := r.checkGateway(ctx, run, sc, t.URL, ans, before, phasesBefore); err != nil {
			return nil, err
		}
	}
	if len(run.Errors) == 0 {
		run.Errors = nil
	}
	return run, nil
}

// answered is what the checks after a load need of its answered calls: the run ids the
// gateway named, when each answer ended, and how many came without a run id.
type answered struct {
	runIDs  []string
	ends    map[string]time.Time
	noRunID int
}

// count adds a load's samples to run: requests, answers, errors by kind, latencies and the
// streams' order/loss check (run.Streams, when any answer was a stream).
func (run *Run) count(samples []sample) answered {
	ans := answered{ends: map[string]time.Time{}}
	var st StreamCheck
	streams := false
	for _, s := range samples {
		run.Requests++
		// Latency and TTFB are taken over the answered calls only: a stream that failed its
		// check or was cut after its first line is an error, not a sample of either figure.
		if s.ok {
			run.OK++
			run.lat = append(run.lat, ms(s.lat))
			if s.ttfb > 0 {
				run.ttfb = append(run.ttfb, ms(s.ttfb))
			}
		} else {
			run.Errors[s.errKind]++
		}
		if s.status == http.StatusOK && (s.lost > 0 || s.reorder || s.noDone || s.ttfb > 0) {
			streams = true
			st.Streams++
			st.Lost += s.lost
			if s.reorder {
				st.Reordered++
			}
			if s.noDone {
				st.NoDone++
			}
		}
		if s.ok && s.runID != "" {
			ans.runIDs = append(ans.runIDs, s.runID)
			ans.ends[s.runID] = s.end
		} else if s.ok {
			ans.noRunID++
		}
	}
	if streams {
		run.Streams = &st
	}
	return ans
}

// checkDrain is the drain scenario's balance check, with the answers the drain user got.
func (r *runner) checkDrain(ctx context.Context, samples []sample) (Balance, error) {
	b, err := checkBalance(ctx, r.db, r.keys.DrainID, r.keys.DrainAllowance)
	if err != nil {
		return Balance{}, err
	}
	for _, s := range samples {
		switch {
		case s.ok:
			b.Admitted++
		case s.status == http.StatusPaymentRequired:
			b.Refused402++
		case s.status == http.StatusTooManyRequests:
			b.Refused429++
		default:
			b.OtherErrors++
		}
	}
	// Nothing admitted, nothing refused for credits, or other failures: the balance was
	// never reached (or never tried), so its check proves nothing.
	if b.Admitted == 0 || b.Refused402 == 0 || b.OtherErrors > 0 {
		b.Pass = false
	}
	return b, nil
}

// checkGateway adds to a tollgate run what only the gateway has: the ledger check, the
// database counters and gateway phases over the load (from the readings before it), and for
// the settle-lag scenario how long each answered call took to settle.
func (r *runner) checkGateway(ctx context.Context, run *Run, sc scenario, gatewayURL string, ans answered,
	before map[string]float64, phasesBefore map[string]*histogram) error {
	l := checkLedger(ctx, r.db)
	// Every call answered 200 must have been charged: a call served without a hold, or
	// settled at 0, leaves the day ledger and the holds in agreement.
	if n, err := unsettled(ctx, r.db, ans.runIDs); err != nil {
		l.Pass, l.Detail = false, l.Detail+"; "+err.Error()
	} else if l.Unsettled = n + ans.noRunID; l.Unsettled > 0 {
		l.Pass = false
		l.Detail = strings.TrimPrefix(fmt.Sprintf("%s; %d answered calls without a settled charge (%d without a run id)", l.Detail, l.Unsettled, ans.noRunID), "; ")
	}
	// With no call answered the run settled nothing: the ledger agrees with the earlier runs'
	// charges (or is empty), and its agreement says nothing of this run.
	if len(ans.runIDs)+ans.noRunID == 0 {
		l.Pass = false
		l.Detail = strings.TrimPrefix(l.Detail+"; no call of the run was answered 200: no charge of it to check", "; ")
	}
	run.DBPerRequest = perRequest(before, dbCounters(ctx, r.db), run.Requests)
	run.GatewayPhases = phaseDelta(phasesBefore, readPhases(ctx, gatewayURL))
	if d, ok := run.GatewayPhases[settleKey]; ok {
		delete(run.GatewayPhases, settleKey)
		if sc.lag {
			run.SettleCommit = &d
		}
	}
	run.Ledger = &l
	if !sc.lag {
		return nil
	}
	at, err := settledAt(ctx, r.db, ans.runIDs)
	if err != nil {
		return err
	}
	var lags []float64
	for _, id := range ans.runIDs {
		if sa, ok := at[id]; ok {
			lags = append(lags, ms(sa.Sub(ans.ends[id])))
		} else {
			run.LagMissing++
		}
	}
	d := distOf(lags)
	run.SettleLag = &d
	return nil
}

// profile fetches a CPU and an allocation profile of the gateway over the next sec seconds. The
// files are named relative to the results file (profileName): results are committed, and a
// path of the machine that ran them means nothing on another.
func (r *runner) profile(name string, sec int) []string {
	if err := os.MkdirAll(r.profDir, 0o755); err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	done := make(chan string, 2)
	get := func(kind, path string) {
		file := filepath.Join(r.profDir, name+"."+kind+".pprof")
		resp, err := http.Get(r.pprof + path)
		if err != nil {
			done <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(file)
		if err != nil {
			done <- "error: " + err.Error()
			return
		}
		// A profile cut short is worse than none: it reads as a real one.
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			done <- "error: " + r.profileName(file) + ": " + err.Error()
			return
		}
		done <- r.profileName(file)
	}
	s := strconv.Itoa(sec)
	go get("cpu", "/debug/pprof/profile?seconds="+s)
	go get("allocs", "/debug/pprof/allocs?seconds="+s)
	out = append(out, <-done, <-done)
	slices.Sort(out)
	return out
}

// profileName is file relative to the results file's directory, or as given where it is not
// under it (-profile-dir elsewhere, or no -out).
func (r *runner) profileName(file string) string {
	if r.outDir == "" {
		return file
	}
	rel, err := filepath.Rel(r.outDir, file)
	if err != nil || strings.HasPrefix(rel, "..") {
		return file
	}
	return rel
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func hostInfo() map[string]any {
	h := map[string]any{"loadavg_end": loadavg(), "go": runtime.Version(), "cpus": runtime.NumCPU(), "goos": runtime.GOOS, "goarch": runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				h["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return h
}
