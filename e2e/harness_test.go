// Package e2e runs real gateway processes (the built binary) against a real MariaDB and Redis
// and an in-process fake upstream, and kills them: what must survive a process's death can only
// be shown with a process that dies.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/pricing"
)

// gatewayBin is the gateway built once for the package by TestMain.
var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tollgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	args := []string{"build", "-o", gatewayBin}
	if gatewayUnderRace() {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/gateway")...)
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build gateway:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// gatewayUnderRace says whether the gateway the tests run is built with -race: when
// E2E_GATEWAY_RACE=1 and the tests themselves are (`go test -race`). Off by default: under the
// detector the gateways run several times slower on a 2-core box, and the chaos and storm tests'
// timing (settlements still on their way when a forced reconcile runs) then fails runs that
// say nothing of the product. A race it sees makes a process that exits exit 66 (the SIGTERM
// tests see a failed exit) and is in the log of one that was killed (see raceInLog), which
// every test reads at cleanup either way.
func gatewayUnderRace() bool {
	return os.Getenv("E2E_GATEWAY_RACE") == "1" && testsUnderRace
}

// raceInLog is the race report a gateway's log holds ("" for none): a killed process never
// exits 66, so its races are only in its log.
func raceInLog(log []byte) string {
	i := bytes.Index(log, []byte("WARNING: DATA RACE"))
	if i < 0 {
		return ""
	}
	return string(log[i:min(len(log), i+6000)])
}

// Short settings so a crash is reconciled in seconds. They keep the production ratios: the
// heartbeat well inside the lease, the lock TTL below the reconcile interval.
const (
	testHoldTTL       = 3 * time.Second
	testLeaseTTL      = 2 * time.Second
	testHeartbeat     = 500 * time.Millisecond
	testReconcile     = time.Second
	testLockTTL       = 900 * time.Millisecond
	testShutdownDrain = 2 * time.Second
)

// world is what the gateways of one test share: a fresh database, one Redis under a fresh key
// prefix, one fake upstream, and a config file.
type world struct {
	t        *testing.T
	dsn      string
	db       *sqlx.DB
	store    *holds.Store
	redisURL string // the gateways' REDIS_URL: the shared test Redis, or a private one
	rdb      *redis.Client
	prefix   string
	keys     runstate.Keys
	tally    *runstate.Tally
	upstream *httptest.Server
	held     *heldUpstream // in front of upstream's fakellm: holds streams mid-stream on request
	config   string
	price    pricing.Price
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOn(t, testenv.MySQLDSN(t), "")
}

// newWorldAt is newWorld on the migrated database dsn (a MariaDB of the test's own, say).
func newWorldAt(t *testing.T, dsn string) *world {
	t.Helper()
	return newWorldOn(t, dsn, "")
}

// newPrivateRedisWorld is a world whose Redis is a server of its own (testenv.PrivateRedisURL),
// for a test that wipes it (FLUSHALL: a restart without persistence) — on the shared Redis that
// would wipe every other test's keys too.
func newPrivateRedisWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOn(t, testenv.MySQLDSN(t), testenv.PrivateRedisURL(t))
}

// newWorldOn builds a world on the migrated database dsn and the Redis at redisURL, or on the
// shared test Redis under a fresh key prefix when it is "".
func newWorldOn(t *testing.T, dsn, redisURL string) *world {
	t.Helper()
	w := &world{t: t, dsn: dsn}
	db, err := holds.Open(context.Background(), w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w.db = db
	if redisURL == "" {
		w.redisURL = testenv.RedisURL(t)
		w.rdb, w.prefix = testenv.Redis(t)
	} else {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			t.Fatalf("parse private Redis URL: %v", err)
		}
		w.redisURL, w.rdb, w.prefix = redisURL, redis.NewClient(opt), "t"+testenv.RandomID(6)+":"
		t.Cleanup(func() { w.rdb.Close() })
	}
	w.keys = runstate.Keys{Prefix: w.prefix}
	w.tally = runstate.NewTally(w.rdb, w.keys, time.Hour)
	w.held = newHeldUpstream(fakellm.New(fakellm.Config{}))
	w.upstream = httptest.NewServer(w.held)
	t.Cleanup(w.upstream.Close)
	// Same plans as the gateway's defaults (credit_micro 1000).
	w.store = holds.NewStore(db, map[string]holds.Plan{"standard": {AllowanceMicro: 2_000_000, HoldNormalMicro: 20_000,
		HoldHeavyMicro: 60_000, HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostMicro: 500_000}}, "standard", zap.NewNop())
	// fake-gpt at the default prices: $2.50 / $10 per million input / output tokens.
	w.price = pricing.Price{Input: 2_500_000, CacheRead: 1_250_000, CacheWrite: 3_125_000, Output: 10_000_000}
	w.config = w.writeConfig(nil)
	// What the world's gateways record at their start, for the operator's commands a test runs
	// before or without one (they refuse to convert credits, use plan terms, read the
	// gateways' Redis keys, or prune, while nothing is recorded): the world's config has the
	// default plans and TTLs, w.store standard alone.
	if _, _, err := w.store.RecordCreditUnit(context.Background(), 1000, "e2e-world", false); err != nil {
		t.Fatal(err)
	}
	defaults := config.Default()
	if _, _, err := holds.NewStore(db, plans.FromConfig(defaults), defaults.DefaultPlan, zap.NewNop()).
		RecordPlanTerms(context.Background(), "e2e-world"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.store.RecordRedisPrefix(context.Background(), w.prefix, "e2e-world", false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.store.RecordTTLs(context.Background(), defaults.Holds.TallyTTL, defaults.Dedup.ReplayTTL, "e2e-world"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.CheckLedger(t, w.db) })
	t.Cleanup(func() { w.keepTables() })
	return w
}

// keepTables writes the world's run_holds and sessions tables, tab-separated, beside the logs
// keepLog keeps: the database is dropped at cleanup.
func (w *world) keepTables() {
	dir, ok := keptDir(w.t)
	if !ok {
		return
	}
	for _, table := range []string{"run_holds", "sessions"} {
		if err := dumpTable(w.db, table, filepath.Join(dir, table+".tsv")); err != nil {
			w.t.Errorf("E2E_KEEP_LOGS: %v", err)
		}
	}
}

// dumpTable writes every row of table to path, a header line of its columns first.
func dumpTable(db *sqlx.DB, table, path string) error {
	rows, err := db.Query("SELECT * FROM " + table)
	if err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return fmt.Errorf("columns of %s: %w", table, err)
	}
	var b strings.Builder
	b.WriteString(strings.Join(cols, "\t") + "\n")
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("row of %s: %w", table, err)
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteByte('\t')
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				b.Write(v)
			}
		}
		b.WriteByte('\n')
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("rows of %s: %w", table, err)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// baseConfig is every world's config file, as "section.key" -> value.
func baseConfig() map[string]string {
	return map[string]string{
		"holds.hold_ttl": testHoldTTL.String(), "holds.run_ttl": testHoldTTL.String(),
		"holds.lease_ttl": testLeaseTTL.String(), "holds.heartbeat_interval": testHeartbeat.String(),
		"holds.reconcile_interval": testReconcile.String(), "holds.reconcile_lock_ttl": testLockTTL.String(),
		"limits.shutdown_timeout": testShutdownDrain.String(), "limits.settle_timeout": "10s",
		"dedup.window": "0s",
	}
}

// writeConfig writes a config file of the base settings with over applied ("section.key" ->
// value; "" removes a setting) and returns its path.
func (w *world) writeConfig(over map[string]string) string {
	w.t.Helper()
	all := baseConfig()
	for k, v := range over {
		if v == "" {
			delete(all, k)
		} else {
			all[k] = v
		}
	}
	sections := map[string][]string{}
	for k, v := range all {
		sec, key, _ := strings.Cut(k, ".")
		sections[sec] = append(sections[sec], fmt.Sprintf("  %s: %s\n", key, v))
	}
	var b strings.Builder
	for _, sec := range slices.Sorted(maps.Keys(sections)) {
		b.WriteString(sec + ":\n")
		lines := sections[sec]
		slices.Sort(lines)
		for _, l := range lines {
			b.WriteString(l)
		}
	}
	path := filepath.Join(w.t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// user creates an account and a key; maxInFlight lifts the plan's limit of 3.
func (w *world) user(name string, maxInFlight int, allowanceMicro *int64) (holds.User, string) {
	w.t.Helper()
	ctx := context.Background()
	u, err := w.store.CreateUser(ctx, name, "standard")
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.store.SetUserLimits(ctx, u.ID, allowanceMicro, &maxInFlight, nil); err != nil {
		w.t.Fatal(err)
	}
	key, err := w.store.CreateKey(ctx, u.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return u, key
}

// gateway is one `gateway serve` process.
type gateway struct {
	name string
	url  string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // after done: how the process ended
}

// anyPort is a listen address on which the kernel picks the port as the process binds it.
const anyPort = "127.0.0.1:0"

// listenedAt waits for the JSON log line msg ("gateway listening", "pprof listening") of the
// process whose log is at path and returns the address it names; it gives up when done is
// closed (the process ended) or within passes. The port the process bound is known to be its
// own: a port picked free beforehand and closed again was at times taken by another test's
// server in the moment before the gateway bound it, and /readyz answered there by that server.
func listenedAt(path, msg string, done <-chan struct{}, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		if b, err := os.ReadFile(path); err == nil {
			for _, line := range bytes.Split(b, []byte("\n")) {
				var l struct{ Msg, Addr string }
				if json.Unmarshal(line, &l) == nil && l.Msg == msg && l.Addr != "" {
					return l.Addr, nil
				}
			}
		}
		select {
		case <-done:
			return "", fmt.Errorf("exited before %q", msg)
		default:
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q line within %v", msg, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listeningOn waits until the process pid listens on a TCP socket of loopback and returns its
// address, read from the kernel: the sockets among the process's open files
// (/proc/<pid>/fd) and the listening ones of /proc/net/tcp, matched by inode. A gateway
// without -pprof has one listener. It gives up when done is closed (the process exited) or
// within has passed.
func listeningOn(pid int, done <-chan struct{}, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		if addr, ok := listenerOf(pid); ok {
			return addr, nil
		}
		select {
		case <-done:
			return "", errors.New("exited before it listened")
		default:
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("not listening within %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listenerOf is the loopback address of a listening TCP socket of pid, if it has one.
func listenerOf(pid int) (string, bool) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return "", false
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue // closed since the listing
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", false
	}
	// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
			continue
		}
		ip, port, ok := strings.Cut(f[1], ":")
		if !ok || ip != "0100007F" { // 127.0.0.1, as /proc/net/tcp spells it on little-endian machines
			continue
		}
		p, err := strconv.ParseUint(port, 16, 16)
		if err != nil {
			continue
		}
		return fmt.Sprintf("127.0.0.1:%d", p), true
	}
	return "", false
}

// gatewayEnv is the environment of a gateway of this world serving as instance name on addr.
func (w *world) gatewayEnv(name, addr string) []string {
	return append(os.Environ(), "MYSQL_DSN="+w.dsn, "REDIS_URL="+w.redisURL, "LISTEN_ADDR="+addr,
		"UPSTREAM_URL="+w.upstream.URL, "TOLLGATE_INSTANCE="+name, "TOLLGATE_REDIS_PREFIX="+w.prefix)
}

// startGateway runs `gateway serve` as instance name and waits until it answers /readyz.
func (w *world) startGateway(name string) *gateway {
	w.t.Helper()
	return w.startGatewayWith(name, w.config)
}

// startGatewayWith is startGateway with another config file and extra environment (which
// overrides the world's: MYSQL_DSN=..., say).
func (w *world) startGatewayWith(name, config string, env ...string) *gateway {
	w.t.Helper()
	return w.startGatewayLogTo(name, config, nil, env...)
}

// startGatewayLogTo is startGatewayWith writing the process's output to out (nil: its log file).
func (w *world) startGatewayLogTo(name, config string, out *os.File, env ...string) *gateway {
	w.t.Helper()
	for attempt := 0; ; attempt++ {
		g, err := w.tryStart(name, config, env, out)
		if err == nil {
			return g
		}
		if attempt == 2 {
			w.t.Fatalf("gateway %s did not start: %v", name, err)
		}
		w.t.Logf("gateway %s start attempt %d: %v; retrying", name, attempt+1, err)
	}
}

func (w *world) tryStart(name, config string, env []string, out *os.File, flags ...string) (*gateway, error) {
	// The gateway binds a port of the kernel's choice, which the harness reads from its log
	// line, or from the kernel when its log goes to out, which the harness cannot read back: a
	// port picked free beforehand could be taken meanwhile by another package's test server.
	g := &gateway{name: name, log: filepath.Join(w.t.TempDir(), name+".log"), done: make(chan struct{})}
	logf, err := os.Create(g.log)
	if err != nil {
		return nil, err
	}
	if os.Getenv("E2E_GATEWAY_DEBUG") == "1" {
		// Every settlement's line ("settled", at DEBUG): what a rare failure's logs are read for.
		flags = append(flags, "-debug")
	}
	g.cmd = testenv.DiesWithTests(exec.Command(gatewayBin, append([]string{"serve", "-config", config}, flags...)...))
	g.cmd.Env = append(w.gatewayEnv(name, anyPort), env...) // exec keeps the last value of a repeated name
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	if out != nil {
		g.cmd.Stdout, g.cmd.Stderr = out, out
	}
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { g.err = g.cmd.Wait(); logf.Close(); close(g.done) }()
	w.t.Cleanup(func() {
		select {
		case <-g.done:
		default:
			_ = g.cmd.Process.Kill()
			<-g.done
		}
		b, err := os.ReadFile(g.log)
		if err != nil {
			w.t.Errorf("log of gateway %s: %v", name, err)
		}
		if r := raceInLog(b); r != "" {
			w.t.Errorf("gateway %s logged a data race:\n%s", name, r)
		}
		if w.t.Failed() {
			w.t.Logf("log of gateway %s:\n%s", name, tail(b, 8000))
		}
		keepLog(w.t, name, g.cmd.Process.Pid, b)
	})
	deadline := time.Now().Add(20 * time.Second)
	listened := func() (string, error) {
		return listenedAt(g.log, "gateway listening", g.done, time.Until(deadline))
	}
	if out != nil {
		listened = func() (string, error) { return listeningOn(g.cmd.Process.Pid, g.done, time.Until(deadline)) }
	}
	at, err := listened()
	if err != nil {
		_ = g.cmd.Process.Kill()
		<-g.done
		b, _ := os.ReadFile(g.log)
		return nil, fmt.Errorf("%w (process: %v)\n%s", err, g.err, tail(b, 4000))
	}
	g.url = "http://" + at
	for time.Now().Before(deadline) {
		select {
		case <-g.done:
			b, _ := os.ReadFile(g.log)
			return nil, fmt.Errorf("exited: %v\n%s", g.err, tail(b, 4000))
		default:
		}
		resp, err := http.Get(g.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = g.cmd.Process.Kill()
	return nil, fmt.Errorf("not ready within 20s")
}

// keepLog copies a gateway's whole log to $E2E_KEEP_LOGS/<test>/<name>-<pid>.log when that
// variable names a directory: the harness's logs live in t.TempDir, gone with the test, and a
// failure's output holds only each log's tail — a rare failure is explained by the whole
// logs of every process it ran.
func keepLog(t *testing.T, name string, pid int, log []byte) {
	dir, ok := keptDir(t)
	if !ok {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, pid)), log, 0o644); err != nil {
		t.Errorf("E2E_KEEP_LOGS: %v", err)
	}
}

// keptDir is the directory of t's kept logs and tables, $E2E_KEEP_LOGS/<test>, made if need
// be; false when E2E_KEEP_LOGS is unset, or the directory could not be made (t then fails).
func keptDir(t *testing.T) (string, bool) {
	root := os.Getenv("E2E_KEEP_LOGS")
	if root == "" {
		return "", false
	}
	dir := filepath.Join(root, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("E2E_KEEP_LOGS: %v", err)
		return "", false
	}
	return dir, true
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// signal sends sig and, for SIGKILL, waits until the process is gone.
func (g *gateway) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := g.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", g.name, err)
	}
	if sig == syscall.SIGKILL {
		<-g.done
	}
}

// wait waits for the process to exit, up to d.
func (g *gateway) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-g.done:
		return g.err
	case <-time.After(d):
		t.Fatalf("gateway %s still running after %v", g.name, d)
		return nil
	}
}

// chatBody is a small chat request.
func chatBody(stream bool, maxTokens int, content string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "fake-gpt", "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return b
}

// post sends a chat completion with the given extra headers and returns the response; the
// caller closes its body.
func post(t *testing.T, ctx context.Context, g *gateway, key string, body []byte, hdr map[string]string) *http.Response {
	t.Helper()
	resp, err := do(ctx, g, key, body, hdr)
	if err != nil {
		t.Fatalf("POST to %s: %v", g.name, err)
	}
	return resp
}

// do sends a chat completion to g as the holder of key.
func do(ctx context.Context, g *gateway, key string, body []byte, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

// completeCall makes a non-streamed call that must succeed, and returns its run id and the
// usage the upstream reported.
func completeCall(t *testing.T, g *gateway, key string, body []byte, hdr map[string]string) (string, pricing.Usage) {
	t.Helper()
	resp := post(t, context.Background(), g, key, body, hdr)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call on %s: %d %s", g.name, resp.StatusCode, raw)
	}
	var out struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Usage.Completion == 0 {
		t.Fatalf("call on %s: bad body %s (%v)", g.name, raw, err)
	}
	return resp.Header.Get("X-Tollgate-Run-Id"), pricing.Usage{Input: out.Usage.Prompt, Output: out.Usage.Completion}
}

// stream is a streamed call held open by the test.
type stream struct {
	runID  string
	cancel context.CancelFunc
	done   chan struct{}
	chunks int    // content events read, valid after done
	text   int64  // bytes of the answer's text (choices[0].delta.content) read, valid after done
	last   string // the last data line read, valid after done
	err    error  // how reading ended, valid after done
}

// startStream opens a slow stream and returns once its first event has arrived, so the call
// is admitted, leased and forwarding.
func startStream(t *testing.T, g *gateway, key string, chunks int, interval time.Duration, hdr map[string]string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := map[string]string{"X-Fake-Chunks": fmt.Sprint(chunks), "X-Fake-Chunk-Interval": interval.String()}
	for k, v := range hdr {
		h[k] = v
	}
	resp := post(t, ctx, g, key, chatBody(true, chunks+10, "stream please"), h)
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("stream on %s: %d %s", g.name, resp.StatusCode, raw)
	}
	s := &stream{runID: resp.Header.Get("X-Tollgate-Run-Id"), cancel: cancel, done: make(chan struct{})}
	t.Cleanup(cancel)
	// true once the first event has arrived; false if the stream ended without one.
	first := make(chan bool, 1)
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		began := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				s.last = sc.Text()
			}
			if strings.HasPrefix(sc.Text(), "data: {") {
				s.chunks++
				var ev struct {
					Choices []struct {
						Delta struct {
							Content string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
				}
				if json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "data: ")), &ev) == nil && len(ev.Choices) > 0 {
					s.text += int64(len(ev.Choices[0].Delta.Content))
				}
				if !began {
					began = true
					first <- true
				}
			}
		}
		s.err = sc.Err()
		if !began {
			first <- false
		}
	}()
	select {
	case began := <-first:
		if !began {
			// The caller means to act on a call in flight (kill, signal, pause it): one that
			// is already over would let the test pass without the moment it names.
			<-s.done
			t.Fatalf("stream %s on %s ended before its first event: %v, last %q", s.runID, g.name, s.err, s.last)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no first event from %s within 15s", g.name)
	}
	return s
}

// hold reads a run's row.
func (w *world) hold(runID string) holds.Run {
	w.t.Helper()
	var r holds.Run
	if err := w.db.Get(&r, `SELECT run_id, user_id, client_run_id, state, held_micro, cap_micro, cost_micro,
		charged_micro, allowance_part_micro, prepaid_part_micro, in_tok, cache_read_tok, cache_write_tok, out_tok,
		calls, model, discount_bp, estimated, settle_source, expires_at, created_at, settled_at
		FROM run_holds WHERE run_id = ?`, runID); err != nil {
		w.t.Fatalf("hold %s: %v", runID, err)
	}
	return r
}

// liveHolds counts the holds still queued or running.
func (w *world) liveHolds() int {
	w.t.Helper()
	var n int
	if err := w.db.Get(&n, "SELECT COUNT(*) FROM run_holds WHERE state IN ('queued', 'running')"); err != nil {
		w.t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or the deadline passes. Deadlines are generous: they catch
// a hang, they do not measure speed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dbNow is the database clock, the only clock expiry and settlement use.
func (w *world) dbNow() time.Time {
	w.t.Helper()
	var now time.Time
	if err := w.db.Get(&now, "SELECT NOW(6)"); err != nil {
		w.t.Fatal(err)
	}
	return now
}

// ledgerUsed is what the day ledger holds for the user over all its days: what the user's
// settlements charged it. A test's user is its own, charged only while the test runs, so this
// is its ledger whether or not the run straddles midnight UTC: a settlement at 23:59:59.9
// lands on the old day's row, and a read of UTC_DATE()'s row alone at 00:00:00.1 missed it.
func (w *world) ledgerUsed(userID uint64) int64 {
	w.t.Helper()
	return w.ledgerUsedBut(userID, time.Time{})
}

// ledgerUsedBut is ledgerUsed less the row of day (none for the zero time).
func (w *world) ledgerUsedBut(userID uint64, day time.Time) int64 {
	w.t.Helper()
	var used int64
	if err := w.db.Get(&used, "SELECT CAST(COALESCE(SUM(used_micro), 0) AS SIGNED) FROM usage_days WHERE user_id = ? AND day <> ?",
		userID, day.Format(time.DateOnly)); err != nil {
		w.t.Fatalf("day ledger of user %d: %v", userID, err)
	}
	return used
}

// available is what the user may spend, as its balance reckons it, with every day of its
// ledger counted as today's. The balance counts today's row alone: a test that read it before
// a call and again after, across midnight UTC, compared two days' allowances, and the call's
// charge, landed on the old day, was missing from the after. With no midnight in between the
// two agree to the micro-USD. Read it while none of the user's settlements is under way: the
// balance and the other days' rows are two statements.
func (w *world) available(userID uint64) int64 {
	w.t.Helper()
	b, err := w.store.Balance(context.Background(), userID)
	if err != nil {
		w.t.Fatalf("balance of user %d: %v", userID, err)
	}
	used := b.UsedTodayMicro + w.ledgerUsedBut(userID, b.Day)
	return holds.Available(b.AllowanceMicro, used, b.PrepaidMicro, b.HeldMicro)
}

// lockUser takes the user's row lock in a transaction of the test's own, as a stuck money
// transaction would: every admission and settlement of that user waits behind it. release
// rolls it back (once; later calls do nothing).
func (w *world) lockUser(userID uint64) (release func()) {
	w.t.Helper()
	return w.lockRow("SELECT id FROM users WHERE id = ? FOR UPDATE", userID)
}

// lockRow runs lock, a SELECT … FOR UPDATE of one row by arg, in a transaction of the test's
// own (testenv.ConsoleTx) and keeps it open until release (once; later calls do nothing; the
// test's cleanup releases it too).
func (w *world) lockRow(lock string, arg any) (release func()) {
	w.t.Helper()
	tx := testenv.ConsoleTx(w.t, w.db)
	var locked any
	if err := tx.QueryRowContext(context.Background(), lock, arg).Scan(&locked); err != nil {
		w.t.Fatalf("%s (%v): %v", lock, arg, err)
	}
	var once sync.Once
	return func() { once.Do(func() { _ = tx.Rollback() }) }
}

// reservations lists the c:<call id> fields of a named run's budget hash: the calls of the run
// that reserved part of its cap and have not given it back.
func (w *world) reservations(runID string) []string {
	w.t.Helper()
	all, err := w.rdb.HGetAll(context.Background(), w.keys.RunBudget(runID)).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for k, v := range all {
		if strings.HasPrefix(k, "c:") {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// leaseKeys lists the lease keys under the world's prefix.
func (w *world) leaseKeys() []string {
	w.t.Helper()
	keys, err := w.rdb.Keys(context.Background(), w.prefix+"lease:*").Result()
	if err != nil {
		w.t.Fatal(err)
	}
	return keys
}

// reply is how an asynchronous call ended for its client.
type reply struct {
	status int
	runID  string
	body   []byte
	err    error // transport error, or the body's read error
}

// sendAsync posts a chat completion in the background and reports how it ended; unlike post
// it tolerates a connection cut by the gateway.
func sendAsync(ctx context.Context, g *gateway, key string, body []byte, hdr map[string]string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		resp, err := do(ctx, g, key, body, hdr)
		if err != nil {
			out <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- reply{status: resp.StatusCode, runID: resp.Header.Get(RunIDHeaderForTests), body: b, err: err}
	}()
	return out
}

// RunIDHeaderForTests is proxy.RunIDHeader (the e2e package runs the binary, not the package).
const RunIDHeaderForTests = "X-Tollgate-Run-Id"

// RequestIDHeaderForTests is proxy.RequestIDHeader: the request_id of a call's log lines.
const RequestIDHeaderForTests = "X-Tollgate-Request-Id"

// freezer is a TCP relay between a gateway and a server (MariaDB, Redis) that can stop passing
// bytes in both directions while keeping every connection open: a server that hangs, or a
// network that drops its packets, not one that is down. Cut, it resets its connections
// instead: a server that refuses them.
type freezer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	thawed chan struct{} // closed while bytes flow
	// armed: freeze as soon as a client write containing marker has been relayed.
	marker []byte
	fired  chan struct{}
	// cut: every connection is reset and every new one reset as it is accepted, until thaw
	// (a server that refuses connections, not one that hangs); live holds the open ones.
	cutOff bool
	live   map[net.Conn]bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target, thawed: make(chan struct{}), live: map[net.Conn]bool{}}
	close(f.thawed)
	t.Cleanup(func() { f.thaw(); ln.Close() })
	go f.accept()
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			resetConn(c)
			continue
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			f.untrack(c)
			c.Close()
			continue
		}
		go f.pipe(c, s, true)
		go f.pipe(s, c, false)
	}
}

// track records an accepted client connection as open, or reports false while the relay is
// cut.
func (f *freezer) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cutOff {
		return false
	}
	f.live[c] = true
	return true
}

func (f *freezer) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.live, c)
	f.mu.Unlock()
}

// cut resets every client connection through the relay and, until thaw, every new one as soon
// as it is accepted: the client's writes fail, its reads end in a reset.
func (f *freezer) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutOff = true
	for c := range f.live {
		resetConn(c)
		delete(f.live, c)
	}
}

// resetConn closes c with an RST rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (f *freezer) pipe(from, to net.Conn, fromClient bool) {
	defer from.Close()
	defer to.Close()
	if fromClient {
		defer f.untrack(from)
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			f.wait()
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
			if fromClient {
				f.mu.Lock()
				if f.marker != nil && bytes.Contains(buf[:n], f.marker) {
					f.marker = nil
					f.freezeLocked()
					close(f.fired)
				}
				f.mu.Unlock()
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) wait() {
	f.mu.Lock()
	ch := f.thawed
	f.mu.Unlock()
	<-ch
}

func (f *freezer) freeze() { f.mu.Lock(); f.freezeLocked(); f.mu.Unlock() }

func (f *freezer) freezeLocked() {
	select {
	case <-f.thawed:
		f.thawed = make(chan struct{})
	default:
	}
}

// thaw lets bytes flow again (what a freeze held back is delivered: TCP retransmits what a
// dropped packet carried) and ends a cut.
func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutOff = false
	select {
	case <-f.thawed:
	default:
		close(f.thawed)
	}
}

// freezeAfter freezes the relay once a client write containing marker has gone through (the
// server gets it; its answer does not come back). The returned channel closes when it fired.
func (f *freezer) freezeAfter(marker string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marker, f.fired = []byte(marker), make(chan struct{})
	return f.fired
}

// dsnVia is the world's DSN through f.
func (w *world) dsnVia(f *freezer) string {
	w.t.Helper()
	return w.dsnViaAddr(f.addr())
}

// redisAddr is the host:port of the world's Redis.
func (w *world) redisAddr() string {
	w.t.Helper()
	opt, err := redis.ParseURL(w.redisURL)
	if err != nil {
		w.t.Fatal(err)
	}
	return opt.Addr
}

// mysqlAddr is the host:port of the world's MariaDB.
func (w *world) mysqlAddr() string {
	w.t.Helper()
	cfg, err := mysql.ParseDSN(w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	return cfg.Addr
}

// settledAtPrice asserts that runID was settled by source at the price of its prompt and out
// output tokens (X-Fake-Chunks), capped at its cap, its figures the provider's (not estimated).
func (w *world) settledAtPrice(t *testing.T, runID, source string, out int64) {
	t.Helper()
	r := w.hold(runID)
	if r.State != holds.StateSettled || r.SettleSource.String != source || r.Estimated || r.OutTok != out || r.InTok <= 0 ||
		r.ChargedMicro != min(w.price.Cost(pricing.Usage{Input: r.InTok, Output: out}), r.CapMicro) {
		t.Errorf("run %s: %s by %q, charged %d for %d in / %d out (estimated %v, held %d); want settled %s at the price of its reported usage, %d out",
			runID, r.State, r.SettleSource.String, r.ChargedMicro, r.InTok, r.OutTok, r.Estimated, r.HeldMicro, source, out)
	}
}

// cutAtItsText asserts that stream s, cut at the drain's deadline without a usage report, was
// settled by its process (shutdown) at what it used: the prompt's estimate and the estimate of
// the answer text its client read (metering.EstimateOutputTokens), at their price, marked
// estimated. A charge merely above 0 and below the hold let one counted twice through, or one
// of the prompt alone.
func (w *world) cutAtItsText(t *testing.T, s *stream) {
	t.Helper()
	r := w.hold(s.runID)
	out := metering.EstimateOutputTokens(s.text)
	want := min(w.price.Cost(pricing.Usage{Input: r.InTok, Output: out}), r.CapMicro)
	if r.State != holds.StateSettled || r.SettleSource.String != holds.SourceShutdown || !r.Estimated || r.InTok <= 0 ||
		s.text <= 0 || r.OutTok != out || r.ChargedMicro != want || r.ChargedMicro >= r.HeldMicro {
		t.Errorf("stream %s cut at the deadline: %s by %q, charged %d for %d in / %d out (estimated %v, held %d); want settled by shutdown at what it used: %d out for the %d bytes of text its client read, %d",
			s.runID, r.State, r.SettleSource.String, r.ChargedMicro, r.InTok, r.OutTok, r.Estimated, r.HeldMicro, out, s.text, want)
	}
}

// tallyAtPrice asserts that runID's tally is one call of out output tokens (X-Fake-Chunks)
// and a prompt, at their price, and returns its cost: the reconciler settles from the tally,
// so a test that checks a charge against it checks nothing of a tally that was wrong.
func (w *world) tallyAtPrice(t *testing.T, runID string, out int64) int64 {
	t.Helper()
	tl, found, err := w.tally.Get(context.Background(), runID)
	if err != nil || !found {
		t.Fatalf("tally of %s: found %v, %v", runID, found, err)
	}
	if tl.Calls != 1 || tl.Usage.Output != out || tl.Usage.Input <= 0 || tl.CostMicro != w.price.Cost(tl.Usage) {
		t.Errorf("tally of %s: %d calls, %d in / %d out, cost %d; want one call of %d out at its price %d",
			runID, tl.Calls, tl.Usage.Input, tl.Usage.Output, tl.CostMicro, out, w.price.Cost(tl.Usage))
	}
	return tl.CostMicro
}

// reconcileAtTally starts a gateway whose reconciler settles every live hold, and asserts that
// each run of tallies was settled at its tally (run id -> cost, each above 0) and that the
// user's day ledger is their sum.
func (w *world) reconcileAtTally(t *testing.T, userID uint64, tallies map[string]int64) {
	t.Helper()
	w.startGateway("gw-reconciler")
	waitFor(t, 30*time.Second, "the reconciler to settle every hold", func() bool { return w.liveHolds() == 0 })
	var total int64
	for id, cost := range tallies {
		r := w.hold(id)
		if r.SettleSource.String != holds.SourceReconcile || r.ChargedMicro != cost || cost <= 0 {
			t.Errorf("call %s: settled by %q charged %d, want by reconcile at its tally %d (held %d)",
				id, r.SettleSource.String, r.ChargedMicro, cost, r.HeldMicro)
		}
		total += r.ChargedMicro
	}
	if got := w.ledgerUsed(userID); got != total {
		t.Errorf("day ledger %d, want %d", got, total)
	}
}
