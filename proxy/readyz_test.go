package proxy_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering/runstate"
	"github.com/tollgate/tollgate/proxy"
)

// /readyz answers anyone; it must not tell them the database user or the internal addresses.
func TestReadyzDoesNotExposeInternals(t *testing.T) {
	h := newHarness(t, nil)
	bad, err := sqlx.Open("mysql", "tollgate_secret_user:wrong-password@tcp("+mysqlAddrOf(t)+")/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bad.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	log := zap.NewNop()
	store := holds.NewStore(bad, plans.FromConfig(h.cfg), "standard", log)
	keys := runstate.Keys{Prefix: "readyz:"}
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: store, Redis: rdb, Keys: keys,
		Tally:  runstate.NewTally(rdb, keys, h.cfg.Holds.TallyTTL),
		Leases: runstate.NewLeases(rdb, keys, "t", h.cfg.Holds.LeaseTTL, h.cfg.Holds.HeartbeatInterval, log), Log: log})
	t.Cleanup(func() { _ = srv.Close() })
	gw := httptest.NewServer(srv.Handler())
	t.Cleanup(gw.Close)
	resp, err := http.Get(gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	resp.Body.Close()
	t.Logf("/readyz %d: %s", resp.StatusCode, body)
	for _, leak := range []string{"tollgate_secret_user", "127.0.0.1"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("/readyz (no auth) shows %q", leak)
		}
	}
}

// mysqlAddrOf is the test MySQL server's address, from the DSN every test needs: a missing
// one fails the test loudly (testenv.MySQLDSN) rather than skipping it.
func mysqlAddrOf(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Addr
}

// TestReadyzChecksAreBounded: /readyz answers anyone without a key, and each request pinged
// MySQL (a connection of the money paths' pool) and Redis and, with one of them down, logged a
// warning: a flood of it could take the pool from admissions and write the log at the
// caller's pace. The check runs at most once a second whoever asks; the others get its answer.
func TestReadyzChecksAreBounded(t *testing.T) {
	h := newHarness(t, nil)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(core)
	keys := runstate.Keys{Prefix: "readyz:"}
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: h.store, Redis: rdb, Keys: keys,
		Tally:  runstate.NewTally(rdb, keys, h.cfg.Holds.TallyTTL),
		Leases: runstate.NewLeases(rdb, keys, "t", h.cfg.Holds.LeaseTTL, h.cfg.Holds.HeartbeatInterval, log), Log: log})
	t.Cleanup(func() { _ = srv.Close() })
	gw := httptest.NewServer(srv.Handler())
	t.Cleanup(gw.Close)
	start := time.Now()
	const asks = 50
	var wg sync.WaitGroup
	for range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(gw.URL + "/readyz")
			if err != nil {
				t.Error(err)
				return
			}
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"redis":"unavailable"`) {
				t.Errorf("/readyz with Redis down: %d %s", resp.StatusCode, body)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	checks := logs.FilterMessage("readiness: redis unreachable").Len()
	t.Logf("%d asks in %v: %d checks", asks, took, checks)
	if allowed := int(took/time.Second) + 1; checks > allowed {
		t.Fatalf("%d readiness checks for %d asks in %v, want at most %d (one a second)", checks, asks, took, allowed)
	}
}

// TestReadyzSaysWhenMySQLIsUnreachable: DESIGN §8, /readyz is "MySQL and Redis reachable".
// A gateway whose database is out of reach refuses every call (503 billing_unavailable), so
// its readiness must fail too, naming MySQL, while Redis is fine, and the load balancer takes it
// out of rotation; /healthz (alive) stays 200. The other readiness tests take Redis down, alone
// or with MySQL, so the answer to MySQL alone was never read.
func TestReadyzSaysWhenMySQLIsUnreachable(t *testing.T) {
	h := newHarness(t, nil)
	// Nothing listens on port 1: every connection is refused at once.
	down, err := sqlx.Open("mysql", "u:p@tcp(127.0.0.1:1)/none?timeout=500ms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { down.Close() })
	gw := gatewayOnDB(t, h, down)
	get := func(path string) (int, string) {
		resp, err := http.Get(gw.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, string(readAll(t, resp.Body))
	}
	if status, body := get("/readyz"); status != http.StatusServiceUnavailable ||
		!strings.Contains(body, `"mysql":"unavailable"`) || !strings.Contains(body, `"redis":"ok"`) {
		t.Errorf("/readyz with MySQL unreachable and Redis up: %d %s, want 503 naming mysql unavailable, redis ok", status, body)
	}
	if status, body := get("/healthz"); status != http.StatusOK {
		t.Errorf("/healthz with MySQL unreachable: %d %s, want 200 (the process is alive)", status, body)
	}
}

// TestReadyzNamesOnlyTheDependencyThatStalls: a database that takes connections and never
// answers (a partition, a server stopped with SIGSTOP) used the whole check's time, and Redis
// was then pinged with a context already ended: /readyz said "redis":"unavailable" beside
// MySQL, and logged Redis unreachable, with Redis fine, sending the operator after the wrong
// store. Each dependency is checked on its own time.
func TestReadyzNamesOnlyTheDependencyThatStalls(t *testing.T) {
	h := newHarness(t, nil)
	stalled, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The listener is closed and its accept loop has ended before the held connections are
	// waited for: a connection accepted (held.Add) while Wait ran raced it.
	var held sync.WaitGroup
	accepting := make(chan struct{})
	t.Cleanup(func() {
		stalled.Close()
		<-accepting
		held.Wait()
	})
	go func() {
		defer close(accepting)
		for {
			conn, err := stalled.Accept()
			if err != nil {
				return
			}
			// Never sends the server's greeting; closed when the test ends.
			held.Add(1)
			go func() {
				defer held.Done()
				defer conn.Close()
				_, _ = io.Copy(io.Discard, conn)
			}()
		}
	}()
	db, err := sqlx.Open("mysql", "u:p@tcp("+stalled.Addr().String()+")/none?timeout=30s&readTimeout=30s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	gw := gatewayOnDB(t, h, db)
	start := time.Now()
	// A probe gives up long before the driver's 30 s: the stalled check must end at its own
	// bound (readyCheckTimeout), not the driver's, for the probe to be answered at all.
	probe := &http.Client{Timeout: 15 * time.Second}
	resp, err := probe.Get(gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := string(readAll(t, resp.Body))
	resp.Body.Close()
	t.Logf("/readyz %d in %v: %s", resp.StatusCode, time.Since(start), body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"mysql":"unavailable"`) ||
		!strings.Contains(body, `"redis":"ok"`) {
		t.Errorf("/readyz with MySQL stalled and Redis up: %d %s, want 503 naming mysql unavailable, redis ok", resp.StatusCode, body)
	}
}

// gatewayOnDB serves a gateway on the harness's Redis and the database db, for a readiness
// check to find what becomes of db.
func gatewayOnDB(t *testing.T, h *harness, db *sqlx.DB) *httptest.Server {
	t.Helper()
	log := zap.NewNop()
	store := holds.NewStore(db, plans.FromConfig(h.cfg), "standard", log)
	srv := proxy.New(proxy.Deps{Config: h.cfg, Store: store, Redis: h.rdb, Keys: h.keys, Tally: h.tally,
		Leases: runstate.NewLeases(h.rdb, h.keys, "t", h.cfg.Holds.LeaseTTL, h.cfg.Holds.HeartbeatInterval, log), Log: log})
	t.Cleanup(func() { _ = srv.Close() })
	gw := httptest.NewServer(srv.Handler())
	t.Cleanup(gw.Close)
	return gw
}

// TestReadyzAnswerFollowsADependencyThatGoesDown: /readyz's answer is kept for a moment
// (readyFor) so that a flood of probes runs one check, not for good: a gateway that was ready
// and then lost Redis must say so to the next probes, or the load balancer keeps sending it
// calls that it refuses.
func TestReadyzAnswerFollowsADependencyThatGoesDown(t *testing.T) {
	h := newHarness(t, nil)
	readyz := func() (int, string) {
		resp, err := http.Get(h.gw.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, string(readAll(t, resp.Body))
	}
	if status, body := readyz(); status != http.StatusOK {
		t.Fatalf("/readyz with both stores up: %d %s", status, body)
	}
	h.rdb.Close()
	waitFor(t, "/readyz to say Redis is unavailable once its answer from before is stale", func() bool {
		status, body := readyz()
		return status == http.StatusServiceUnavailable && strings.Contains(body, `"redis":"unavailable"`)
	})
}
