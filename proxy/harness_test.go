package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// harness is a gateway in process against real MariaDB and Redis and an in-process fakellm.
type harness struct {
	t     *testing.T
	cfg   *config.Config
	db    *sqlx.DB
	store *holds.Store
	rdb   *redis.Client
	// gwRDB is the gateway's Redis client: rdb, or a Cluster client (harnessSetup.cluster).
	gwRDB    redis.UniversalClient
	keys     runstate.Keys
	tally    *runstate.Tally
	leases   *runstate.Leases
	fake     *fakellm.Server
	upstream *httptest.Server
	srv      *proxy.Server
	gw       *httptest.Server
	// metrics are the gateway's series; a test's own reconciler reports to them as
	// cmd/gateway's does.
	metrics *proxy.Metrics
	// watched are the request contexts of the calls sent with watchHeader, by its value
	// (callerGone).
	watched sync.Map
}

// watchHeader names a call whose request context the harness keeps (callerGone).
const watchHeader = "X-Test-Watch"

// callerGone waits until the gateway has seen the caller of the call sent with watchHeader
// name leave: the server cancels a request's context only once its connection's read sees
// the close, some moments after the client's side has returned, and a test that resumes the
// call before then races that read.
func (h *harness) callerGone(name string) {
	h.t.Helper()
	v, ok := h.watched.Load(name)
	if !ok {
		h.t.Fatalf("no call sent with %s: %s reached the gateway", watchHeader, name)
	}
	select {
	case <-v.(context.Context).Done():
	case <-time.After(10 * time.Second):
		h.t.Fatalf("the gateway did not see the caller of %s leave within 10 s", name)
	}
}

func newHarness(t *testing.T, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessWithFixtures(t, testenv.FixturesDir(t), mutate)
}

// newHarnessMidday is newHarness with the database clock standing still at noon UTC
// (testenv.MySQLMidday), for a test that reads a day's figures (used_today) after its calls
// settled: a midnight UTC falling in between would show the charge on yesterday's row.
func newHarnessMidday(t *testing.T, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessOn(t, harnessSetup{db: testenv.MySQLMidday(t)}, mutate)
}

// newHarnessWithFixtures is newHarness with fakellm replaying from fixturesDir.
func newHarnessWithFixtures(t *testing.T, fixturesDir string, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessOn(t, harnessSetup{fixturesDir: fixturesDir}, mutate)
}

// harnessSetup is what newHarnessOn builds on; zero fields take the defaults.
type harnessSetup struct {
	db          *sqlx.DB // default: a fresh test database
	fixturesDir string   // default: the recorded fixtures
	// tallyDialer, if set, is how the tally's own Redis client connects: a test puts a
	// gate between the tally and Redis.
	tallyDialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// redisDialer, if set, is how the gateway's main Redis client (run budgets, leases)
	// connects.
	redisDialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// contextTimeouts makes the redisDialer client honour its calls' context deadlines, as
	// the gateway's own client does (cmd/gateway redisOptions): without it go-redis waits
	// out its read timeout and retries whatever the deadline.
	contextTimeouts bool
	// redisReadTimeout, if set, is the redisDialer client's read timeout: a test whose writes
	// reach Redis late (testenv.RedisWriteLate) makes the client give up on them sooner than
	// the gateway's own deadlines would.
	redisReadTimeout time.Duration
	// log, if set, is the gateway's logger (default: the test's, warnings and above).
	log *zap.Logger
	// admin, if set, is served under /admin.
	admin http.Handler
	// transport, if set, is how the gateway reaches the upstream.
	transport http.RoundTripper
	// serverLog has the gateway's http.Server log to log, as cmd/gateway's does (net/http's
	// own lines: a handler's panic, a bad request it refused); default: the standard log.
	serverLog bool
	// cluster, if set, makes the gateway's Redis client (tally, leases, run budgets, dedup,
	// h.gwRDB) a Cluster client: clusterOn, one on the test Redis (testenv.ClusterOn) which
	// refuses what a Redis Cluster refuses, or realCluster, one of a Cluster of three masters
	// of the test's own (testenv.RedisCluster). h.rdb still reads the test Redis.
	cluster clusterKind
	// sessionCheckInterval is the gateway's (proxy.Deps.SessionCheckInterval).
	sessionCheckInterval time.Duration
}

// clusterKind is what Redis Cluster, if any, the gateway of a harness talks to.
type clusterKind int

const (
	noCluster clusterKind = iota
	clusterOn
	realCluster
)

// newHarnessOn is newHarness built on setup.
func newHarnessOn(t *testing.T, setup harnessSetup, mutate func(*config.Config)) *harness {
	t.Helper()
	if setup.db == nil {
		setup.db = testenv.MySQL(t)
	}
	if setup.fixturesDir == "" {
		setup.fixturesDir = testenv.FixturesDir(t)
	}
	h := &harness{t: t}
	h.db = setup.db
	var prefix string
	h.rdb, prefix = testenv.Redis(t)
	h.keys = runstate.Keys{Prefix: prefix}
	if setup.redisDialer != nil {
		opt := *h.rdb.Options()
		opt.Dialer = setup.redisDialer
		opt.ContextTimeoutEnabled = setup.contextTimeouts
		if setup.redisReadTimeout != 0 {
			opt.ReadTimeout = setup.redisReadTimeout
		}
		h.rdb = redis.NewClient(&opt)
		t.Cleanup(func() { h.rdb.Close() })
	}
	h.fake = fakellm.New(fakellm.Config{FixturesDir: setup.fixturesDir})
	h.upstream = httptest.NewServer(h.fake)
	t.Cleanup(h.upstream.Close)

	cfg := config.Default()
	cfg.MySQLDSN, cfg.RedisURL, cfg.Instance = "unused", "redis://unused", "test"
	cfg.Upstreams = []config.Upstream{
		{Name: "fake-openai", Kind: "openai", BaseURL: h.upstream.URL, APIKey: "", Models: []string{"*"}},
		{Name: "fake-anthropic", Kind: "anthropic", BaseURL: h.upstream.URL, Models: []string{"claude*"}},
	}
	cfg.Models["claude-test"] = cfg.Models["fake-gpt"]
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	h.cfg = cfg
	log := setup.log
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	h.store = holds.NewStore(h.db, plans.FromConfig(cfg), "standard", log)
	var gwRDB redis.UniversalClient = h.rdb
	switch setup.cluster {
	case clusterOn:
		gwRDB = testenv.ClusterOn(t, h.rdb)
	case realCluster:
		gwRDB = testenv.RedisCluster(t)
	}
	h.gwRDB = gwRDB
	tallyRDB := gwRDB
	if setup.tallyDialer != nil {
		opt := *h.rdb.Options()
		opt.Dialer = setup.tallyDialer
		tallyRDB = redis.NewClient(&opt)
		t.Cleanup(func() { tallyRDB.Close() })
	}
	h.tally = runstate.NewTally(tallyRDB, h.keys, cfg.Holds.TallyTTL)
	h.leases = runstate.NewLeases(gwRDB, h.keys, cfg.Instance, cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, log)
	// As cmd/gateway wires them: the store's committed settlements count in the metrics (those
	// of a secondGateway on the same store too).
	metrics := proxy.NewMetrics(nil)
	h.metrics = metrics
	h.store.OnSettled(metrics.ObserveSettled)
	h.srv = proxy.New(proxy.Deps{Config: cfg, Store: h.store, Redis: gwRDB, Keys: h.keys, Tally: h.tally, Leases: h.leases, Log: log,
		Admin: setup.admin, Metrics: metrics, Transport: setup.transport, SessionCheckInterval: setup.sessionCheckInterval})
	handler := h.srv.Handler()
	h.gw = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get(watchHeader); name != "" {
			h.watched.Store(name, r.Context())
		}
		handler.ServeHTTP(w, r)
	}))
	if setup.serverLog {
		h.gw.Config.ErrorLog = zap.NewStdLog(log)
	}
	h.gw.Start()
	t.Cleanup(func() {
		h.gw.Close()
		h.settled()
		_ = h.srv.Close()
		testenv.CheckLedger(t, h.db)
	})
	return h
}

// user creates an account with a fresh key.
func (h *harness) user(plan string) (holds.User, string) {
	h.t.Helper()
	ctx := context.Background()
	u, err := h.store.CreateUser(ctx, "u"+testenv.RandomID(4), plan)
	if err != nil {
		h.t.Fatal(err)
	}
	key, err := h.store.CreateKey(ctx, u.ID)
	if err != nil {
		h.t.Fatal(err)
	}
	return u, key
}

// post sends a request to the gateway.
func (h *harness) post(key, path, body string, hdr map[string]string) *http.Response {
	h.t.Helper()
	resp, err := http.DefaultClient.Do(h.newRequest(key, path, body, hdr))
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// postOK is post for a call that must be answered 200: it reads the answer whole, closes
// the body and fails t (with the answer) on any other status. It returns the response,
// for its header, and the answer. Most tests check a 200 this way before what they are
// about; one place for it keeps those checks the same and the tests short.
func (h *harness) postOK(t *testing.T, key, path, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp := h.post(key, path, body, hdr)
	answer := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s, want 200", path, resp.StatusCode, answer)
	}
	return resp, answer
}

// newRequest is a POST of a JSON body to the gateway with key (none if "") and hdr.
func (h *harness) newRequest(key, path, body string, hdr map[string]string) *http.Request {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.gw.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

// settled waits for every deferred settlement the gateway started.
func (h *harness) settled() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.srv.WaitSettlements(ctx); err != nil {
		h.t.Fatalf("settlements did not finish: %v", err)
	}
}

// run reads a run after its settlement finished.
// answeredRun sends a call that must be answered 200 and returns its settled run and the
// answer.
func (h *harness) answeredRun(userID uint64, key, path, body string, hdr map[string]string) (holds.Run, []byte) {
	h.t.Helper()
	status, answer, run := h.postRun(userID, key, path, body, hdr)
	if status != http.StatusOK {
		h.t.Fatalf("%s: %d %s, want 200", path, status, answer)
	}
	return run, answer
}

// postRun sends a call, whatever its answer, and returns its status, its answer and its
// settled run.
func (h *harness) postRun(userID uint64, key, path, body string, hdr map[string]string) (int, []byte, holds.Run) {
	h.t.Helper()
	resp := h.post(key, path, body, hdr)
	answer := readAll(h.t, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, answer, h.run(userID, resp.Header.Get(proxy.RunIDHeader))
}

func (h *harness) run(userID uint64, runID string) holds.Run {
	h.t.Helper()
	h.settled()
	r, err := h.store.Run(context.Background(), userID, runID)
	if err != nil {
		h.t.Fatalf("run %s: %v", runID, err)
	}
	return r
}

// holdCount counts all holds, and those still live.
func (h *harness) holdCount() (all, live int) {
	h.t.Helper()
	if err := h.db.Get(&all, "SELECT COUNT(*) FROM run_holds"); err != nil {
		h.t.Fatal(err)
	}
	if err := h.db.Get(&live, "SELECT COUNT(*) FROM run_holds WHERE state <> 'settled'"); err != nil {
		h.t.Fatal(err)
	}
	return all, live
}

func readAll(t *testing.T, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// errorCode reads the OpenAI error shape and returns its code.
func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error shape: %s", body)
	}
	return e.Error.Code
}

// direct sends body straight to fakellm, as the gateway would after its rewrite.
func (h *harness) direct(path, body string, hdr map[string]string) []byte {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.upstream.URL+path, bytes.NewReader([]byte(body)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	return readAll(h.t, resp.Body)
}

type configT = config.Config

// bigPlan lets one test user make many calls in a row.
func bigPlan(p config.Plan) config.Plan {
	p.MaxInFlight = 64
	p.AllowanceCredits = config.CreditsOf(1_000_000)
	p.MaxRunCostCredits = config.CreditsOf(100_000)
	return p
}

// wrappedDialer dials TCP and hands each connection to wrap: a test's hook between a client
// and its server.
func wrappedDialer(wrap func(net.Conn) net.Conn) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
}

// settleRun posts POST /v1/runs/{id}/settle and returns the answer's status and body.
func (h *harness) settleRun(key, id string) (int, []byte) {
	h.t.Helper()
	resp := h.post(key, "/v1/runs/"+id+"/settle", "", nil)
	defer resp.Body.Close()
	return resp.StatusCode, readAll(h.t, resp.Body)
}

// holdAtFirst stops the first call to reach step (a store step told to ObserveSteps) there until
// resume is called, as a process killed or paused at that moment would leave it; reached is
// closed once it is held. resume may be called more than once, and is called when the test
// ends, so a held call never outlives its harness.
func (h *harness) holdAtFirst(step string) (reached <-chan struct{}, resume func()) {
	at, let := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	h.srv.ObserveSteps(func(_ context.Context, s string) {
		if s == step && first.CompareAndSwap(false, true) {
			close(at)
			<-let
		}
	})
	var once sync.Once
	resume = func() { once.Do(func() { close(let) }) }
	h.t.Cleanup(resume)
	return at, resume
}

// waitSettled polls until runID's hold is settled; past within it fails, saying why the run
// should have settled.
func (h *harness) waitSettled(runID string, within time.Duration, why string) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var state string
		if err := h.db.Get(&state, "SELECT state FROM run_holds WHERE run_id = ?", runID); err != nil {
			h.t.Fatal(err)
		}
		if holds.State(state) == holds.StateSettled {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("run %s still %s after %v: %s", runID, state, within, why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// postRefused posts body and asserts the refusal happened before anything was held or
// forwarded: status and error code as wanted (code "" takes any), no call reached the
// upstream, and no hold was taken — not even one released at once (a run_holds row).
func (h *harness) postRefused(t *testing.T, key, path, body string, hdr map[string]string, status int, code string) {
	t.Helper()
	holdsBefore, _ := h.holdCount()
	calls := h.fake.Calls()
	resp := h.post(key, path, body, hdr)
	out := readAll(t, resp.Body)
	resp.Body.Close()
	got := errorCode(t, out)
	if resp.StatusCode != status || (code != "" && got != code) {
		t.Fatalf("%d %s, want %d %s", resp.StatusCode, out, status, code)
	}
	if holdsAfter, _ := h.holdCount(); h.fake.Calls() != calls || holdsAfter != holdsBefore {
		t.Fatalf("a refused request reached the upstream (%d → %d calls) or took a hold (%d → %d holds)",
			calls, h.fake.Calls(), holdsBefore, holdsAfter)
	}
}
