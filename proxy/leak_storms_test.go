package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy"
)

// A long-running gateway must come back to where it rested after each kind of abuse: the
// tests below run a storm, let it end and settle, and then wait (with a deadline, never a
// pace) for every count that follows the calls in flight to come back to its baseline —
// goroutines, database and Redis connections in use, the server's own per-call and per-caller
// tables (Server.Residue) — and check that the storm left no Redis key without a TTL, no key
// cache entry for a key that was refused, and no metric series per name a caller made up.

// leakWatch is a harness's resting state, taken after a warm-up that started every lazy
// background worker (the session cancel bus, key lookup and batch workers).
type leakWatch struct {
	t          *testing.T
	h          *harness
	upstream   *http.Transport // the gateway's own, whose idle connections are closed before counting
	client     *http.Client    // the storm's callers
	goroutines int
	dbOpen     int
	redisInUse int
	cachedKeys int
	series     int
}

// leakHarness is a gateway on real MariaDB and Redis whose upstream is up (nil: the recorded
// fakellm), with a transport the test can empty of idle connections.
func leakHarness(t *testing.T, up http.HandlerFunc, mutate func(*config.Config)) *leakWatch {
	t.Helper()
	return leakHarnessOn(t, harnessSetup{}, up, mutate)
}

// leakHarnessOn is leakHarness built on setup (its transport is the watch's own).
func leakHarnessOn(t *testing.T, setup harnessSetup, up http.HandlerFunc, mutate func(*config.Config)) *leakWatch {
	t.Helper()
	tr := proxy.NewTransport(config.Default().Limits)
	setup.transport = tr
	var hostile string
	if up != nil {
		srv := httptest.NewServer(up)
		t.Cleanup(srv.Close)
		hostile = srv.URL
	}
	h := newHarnessOn(t, setup, func(c *config.Config) {
		if hostile != "" {
			c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: hostile, Models: []string{"*"}}}
		}
		if mutate != nil {
			mutate(c)
		}
	})
	t.Cleanup(tr.CloseIdleConnections)
	return &leakWatch{t: t, h: h, upstream: tr, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// warm makes one plain call and one of a session with key, then takes the baseline.
func (w *leakWatch) warm(key string) {
	w.t.Helper()
	for _, hdr := range []map[string]string{nil, {"X-Session-Id": "warm"}} {
		resp := w.h.post(key, "/v1/chat/completions", chatBody, hdr)
		readAll(w.t, resp.Body)
		resp.Body.Close()
	}
	w.h.settled()
	w.quiesce()
	w.goroutines = runtime.NumGoroutine()
	w.dbOpen = w.h.db.Stats().OpenConnections
	st := w.h.rdb.PoolStats()
	w.redisInUse = int(st.TotalConns) - int(st.IdleConns)
	w.cachedKeys = w.h.srv.CachedKeys()
	w.series = w.seriesCount()
}

// quiesce closes every idle connection the test and the gateway keep, whose goroutines would
// otherwise be counted: their number is bounded by the pools, not by the storm.
func (w *leakWatch) quiesce() {
	w.client.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	w.upstream.CloseIdleConnections()
}

// seriesCount is the number of tollgate_ series /metrics exposes.
func (w *leakWatch) seriesCount() int {
	resp, err := w.client.Get(w.h.gw.URL + "/metrics")
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	for _, line := range strings.Split(string(readAll(w.t, resp.Body)), "\n") {
		if strings.HasPrefix(line, "tollgate_") {
			n++
		}
	}
	return n
}

// leakDeadline bounds the wait for a storm's residue to go: the longest wait a call has after
// its caller or upstream is gone is a few seconds (an upstream's close, 2 s; a tally's retry).
const leakDeadline = 30 * time.Second

// back waits for the storm's residue to go and checks what must not be left at all.
func (w *leakWatch) back(storm string) {
	w.t.Helper()
	w.h.settled()
	var last string
	deadline := time.Now().Add(leakDeadline)
	for {
		w.quiesce()
		last = w.residue()
		if last == "" {
			break
		}
		if time.Now().After(deadline) {
			var stacks bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			w.t.Fatalf("%s: %s after it ended and settled, within %v; goroutines left:\n%s", storm, last, leakDeadline, stacks.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if k := w.h.srv.CachedKeys(); k > w.cachedKeys {
		w.t.Errorf("%s: the key cache holds %d keys, %d before", storm, k, w.cachedKeys)
	}
	if n := w.seriesCount(); n > w.series+20 {
		w.t.Errorf("%s: /metrics has %d tollgate_ series, %d before: a label takes the callers' values", storm, n, w.series)
	}
	w.noKeyWithoutTTL(storm)
}

// residue says what has not come back to the baseline yet, or "".
func (w *leakWatch) residue() string {
	var left []string
	for name, n := range w.h.srv.Residue() {
		if n != 0 {
			left = append(left, fmt.Sprintf("%s=%d", name, n))
		}
	}
	dbs := w.h.db.Stats()
	if dbs.InUse != 0 {
		left = append(left, fmt.Sprintf("database connections in use=%d", dbs.InUse))
	}
	st := w.h.rdb.PoolStats()
	if inUse := int(st.TotalConns) - int(st.IdleConns); inUse > w.redisInUse {
		left = append(left, fmt.Sprintf("redis connections in use=%d (%d at rest)", inUse, w.redisInUse))
	}
	// Each open database connection has a watcher goroutine of the driver's; the pool keeps
	// what it opened (bounded by its size), so they are allowed for.
	allowed := w.goroutines + max(0, dbs.OpenConnections-w.dbOpen) + 4
	if g := runtime.NumGoroutine(); g > allowed {
		left = append(left, fmt.Sprintf("goroutines=%d (%d at rest, %d allowed)", g, w.goroutines, allowed))
	}
	return strings.Join(left, ", ")
}

// noKeyWithoutTTL fails on a Redis key of the test's prefix that never lapses.
func (w *leakWatch) noKeyWithoutTTL(storm string) {
	w.t.Helper()
	ctx := context.Background()
	iter := w.h.rdb.Scan(ctx, 0, w.h.keys.Prefix+"*", 1000).Iterator()
	n := 0
	for iter.Next(ctx) {
		n++
		if ttl, err := w.h.rdb.PTTL(ctx, iter.Val()).Result(); err == nil && ttl == -1 {
			w.t.Errorf("%s: Redis key %s has no TTL", storm, iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Logf("%s: %d Redis keys, each with a TTL", storm, n)
}

// storm runs each of n requests made by mk on 8 workers and reads every answer whole.
func (w *leakWatch) storm(n int, mk func(i int) *http.Request) map[int]int {
	w.t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := w.client.Do(mk(i))
				status := -1
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return statuses
}

// stormPlan is bigPlan with room for every named run a storm leaves open (they count against
// max_in_flight until they expire).
func stormPlan(p config.Plan) config.Plan {
	p = bigPlan(p)
	p.MaxInFlight = 10_000
	return p
}

// request is one request of a storm (harness.newRequest).
func (w *leakWatch) request(key, path, body string, hdr map[string]string) *http.Request {
	return w.h.newRequest(key, path, body, hdr)
}

// TestStormOfWrongKeysLeavesNothing: 1000 distinct keys that name no one are refused 401, and
// neither the key cache nor anything else keeps them.
func TestStormOfWrongKeysLeavesNothing(t *testing.T) {
	w := leakHarness(t, nil, nil)
	_, key := w.h.user("standard")
	w.warm(key)
	got := w.storm(1000, func(i int) *http.Request {
		return w.request(fmt.Sprintf("tg_wrong%06d%s", i, strings.Repeat("x", 30)), "/v1/chat/completions", chatBody, nil)
	})
	if got[http.StatusUnauthorized] != 1000 {
		t.Fatalf("wrong keys answered %v, want 1000 × 401", got)
	}
	w.back("1000 wrong keys")
}

// TestStormOfUnknownModelsLeavesNothing: 10 000 distinct model names, none priced, and as many
// that a price matches by prefix, which the upstream refuses: no series per name in /metrics, no
// table per name in the process.
func TestStormOfUnknownModelsLeavesNothing(t *testing.T) {
	w := leakHarness(t, nil, func(c *config.Config) {
		c.Models["gpt-x-"] = c.Models["fake-gpt"]
		c.Plans["standard"] = stormPlan(c.Plans["standard"])
	})
	_, key := w.h.user("standard")
	w.warm(key)
	got := w.storm(10000, func(i int) *http.Request {
		return w.request(key, "/v1/chat/completions", fmt.Sprintf(`{"model":"nosuch-%d","messages":[{"role":"user","content":"hi"}]}`, i), nil)
	})
	t.Logf("unknown models: %v", got)
	got = w.storm(2000, func(i int) *http.Request {
		return w.request(key, "/v1/chat/completions", fmt.Sprintf(`{"model":"gpt-x-%d","messages":[{"role":"user","content":"hi"}]}`, i), nil)
	})
	t.Logf("priced by prefix, refused upstream: %v", got)
	w.back("unknown model names")
}

// TestStormOfRunNamesAndIdempotencyKeysLeavesNothing: a user opens 300 named runs (each one
// call, none settled), sends 300 calls under distinct Idempotency-Keys (100 of them replayed
// to callers who leave after a line) and 300 under distinct session ids: each name and key
// lives in Redis under a TTL, and nothing of them stays in the process.
func TestStormOfRunNamesAndIdempotencyKeysLeavesNothing(t *testing.T) {
	w := leakHarness(t, nil, func(c *config.Config) {
		c.Plans["standard"] = stormPlan(c.Plans["standard"])
	})
	_, key := w.h.user("standard")
	w.warm(key)
	got := w.storm(300, func(i int) *http.Request {
		return w.request(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": fmt.Sprintf("task-%d", i)})
	})
	t.Logf("named runs: %v", got)
	got = w.storm(300, func(i int) *http.Request {
		body := streamBody
		if i%2 == 0 {
			body = chatBody
		}
		return w.request(key, "/v1/chat/completions", body, map[string]string{"Idempotency-Key": fmt.Sprintf("idem-%d", i)})
	})
	t.Logf("idempotency keys: %v", got)
	// Their replays, each caller leaving after the first line.
	var replays sync.WaitGroup
	for i := range 100 {
		replays.Add(1)
		go func() {
			defer replays.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := streamBody
			if i%2 == 0 {
				body = chatBody
			}
			req := w.request(key, "/v1/chat/completions", body, map[string]string{"Idempotency-Key": fmt.Sprintf("idem-%d", i)}).WithContext(ctx)
			resp, err := w.client.Do(req)
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
			cancel()
			resp.Body.Close()
		}()
	}
	replays.Wait()
	got = w.storm(300, func(i int) *http.Request {
		return w.request(key, "/v1/chat/completions", chatBody, map[string]string{"X-Session-Id": fmt.Sprintf("sess-%d", i)})
	})
	t.Logf("sessions: %v", got)
	w.back("run names, Idempotency-Keys and sessions")
}

// stormUpstream answers each call as the word after "storm:" in its body says: it stalls
// before its headers, resets the connection before or after them, sends garbage, streams
// slowly until its caller goes, or ends its stream and never closes the connection.
func stormUpstream(arrived chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mode := ""
		if _, after, ok := bytes.Cut(body, []byte("storm:")); ok {
			mode, _, _ = strings.Cut(string(after), `"`)
		}
		if arrived != nil {
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
		reset := func() {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			conn.Close()
		}
		switch mode {
		case "stall":
			<-r.Context().Done()
		case "reset":
			reset()
		case "reset-mid":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, hostileChunk)
			w.(http.Flusher).Flush()
			reset()
		case "garbage":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: \x00\xff{{{\n\nevent: ??\ndata: [DOne\n\n"+strings.Repeat("\xfe", 5000))
		case "garbage-json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","choices":[{"message":`+strings.Repeat("[", 3000))
		case "trickle":
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				_, _ = io.WriteString(w, hostileChunk)
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		case "open":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, hostileChunk+hostileUsage+"data: [DONE]\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "flood":
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := strings.Repeat(hostileChunk, 200)
			for r.Context().Err() == nil {
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
		case "open-json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, hostileChunk+hostileUsage+"data: [DONE]\n\n")
		}
	}
}

func leakBody(mode string, stream bool) string {
	return fmt.Sprintf(`{"model":"fake-gpt","stream":%t,"max_tokens":50,"messages":[{"role":"user","content":"storm:%s"}]}`, stream, mode)
}

// TestStormOfHostileUpstreamsLeavesNothing: upstreams that stall before their headers, reset
// the connection before or after them, send garbage, or end a stream (or a whole JSON answer
// with no length) and never close the connection.
func TestStormOfHostileUpstreamsLeavesNothing(t *testing.T) {
	w := leakHarness(t, stormUpstream(nil), func(c *config.Config) {
		c.Plans["standard"] = stormPlan(c.Plans["standard"])
		c.Limits.HeaderTimeout = time.Second
		c.Limits.UpstreamTimeout = 2 * time.Second
	})
	_, key := w.h.user("standard")
	w.warm(key)
	modes := []string{"stall", "reset", "reset-mid", "garbage", "garbage-json", "open", "open-json"}
	got := w.storm(len(modes)*2*20, func(i int) *http.Request {
		mode, stream := modes[i%len(modes)], (i/len(modes))%2 == 0
		return w.request(key, "/v1/chat/completions", leakBody(mode, stream)+strings.Repeat(" ", i), nil)
	})
	t.Logf("hostile upstreams: %v", got)
	w.back("hostile upstreams")
}

// TestStormOfCallersLeavingAtEveryPhaseLeavesNothing: callers that leave with half a body
// sent, while their admission waits in the batch writer's queue, while the upstream's
// headers are awaited, mid-stream, callers that trickle their bodies until refused, and
// callers that stay connected and read nothing.
func TestStormOfCallersLeavingAtEveryPhaseLeavesNothing(t *testing.T) {
	arrived := make(chan struct{}, 1)
	w := leakHarness(t, stormUpstream(arrived), func(c *config.Config) {
		c.Plans["standard"] = stormPlan(c.Plans["standard"])
		c.Limits.ClientWriteTimeout = time.Second
		c.Upstreams = append([]config.Upstream{{Name: "hostile-anthropic", Kind: "anthropic", BaseURL: c.Upstreams[0].BaseURL,
			Models: []string{"claude*"}}}, c.Upstreams...)
	})
	u, key := w.h.user("standard")
	w.warm(key)
	addr := strings.TrimPrefix(w.h.gw.URL, "http://")
	raw := func(body string, sent int, hold time.Duration) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			key, len(body), body[:sent])
		if hold > 0 {
			// A slowloris: its body stops arriving; the gateway answers 408 and closes.
			_ = conn.SetReadDeadline(time.Now().Add(leakDeadline))
			_, _ = bufio.NewReader(conn).ReadString('\n')
		}
	}
	var wg sync.WaitGroup
	each := func(n int, f func(i int)) {
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); f(i) }()
		}
		wg.Wait()
	}
	// Half a body, then gone; and bodies that stop arriving.
	each(40, func(i int) { raw(leakBody("ok", true)+strings.Repeat(" ", i), 30, 0) })
	each(40, func(i int) { raw(leakBody("ok", true)+strings.Repeat(" ", i), 30, time.Second) })

	// Admissions waiting behind the user's row, locked by another transaction.
	tx, err := w.h.db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`SELECT id FROM users WHERE id = ? FOR UPDATE`, u.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var queued sync.WaitGroup
	for i := range 30 {
		queued.Add(1)
		go func() {
			defer queued.Done()
			req := w.request(key, "/v1/chat/completions", leakBody("ok", i%2 == 0)+strings.Repeat(" ", i), nil).WithContext(ctx)
			if resp, err := w.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitForStatement(t, w.h.db, "FOR UPDATE")
	waitFor(t, "the calls to wait for their admission", func() bool { return w.h.srv.Residue()["calls"] >= 30 })
	cancel()
	queued.Wait()
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	// Callers that leave while the upstream's headers are awaited, and mid-stream: plain
	// calls, calls of a named run, of a session, under an Idempotency-Key, and token counts.
	headers := []func(i int) map[string]string{
		func(int) map[string]string { return nil },
		func(i int) map[string]string { return map[string]string{"X-Run-Id": fmt.Sprintf("left-%d", i%3)} },
		func(i int) map[string]string { return map[string]string{"X-Session-Id": fmt.Sprintf("left-%d", i%3)} },
		func(i int) map[string]string { return map[string]string{"Idempotency-Key": fmt.Sprintf("left-%d", i)} },
	}
	leave := func(path, body string, hdr map[string]string, midStream bool) {
		select {
		case <-arrived:
		default:
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := w.request(key, path, body, hdr).WithContext(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := w.client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if midStream {
				_, _ = bufio.NewReader(resp.Body).ReadString('\n')
				cancel()
			}
		}()
		if !midStream {
			select {
			case <-arrived:
			case <-time.After(leakDeadline):
				t.Error("the call never reached the upstream")
			}
			cancel()
		}
		<-done
	}
	for i := range 40 {
		leave("/v1/chat/completions", leakBody("stall", i%2 == 0)+strings.Repeat(" ", i), headers[i%len(headers)](i), false)
	}
	for i := range 10 {
		leave("/v1/messages/count_tokens", `{"model":"claude-test","messages":[{"role":"user","content":"storm:stall `+strings.Repeat(" ", i)+`"}]}`,
			map[string]string{"anthropic-version": "2023-06-01"}, false)
	}
	each(40, func(i int) {
		leave("/v1/chat/completions", leakBody("trickle", true)+strings.Repeat(" ", i), headers[i%len(headers)](i), true)
	})
	// Sessions whose every message replaces the one before it, mid-stream.
	each(20, func(i int) {
		leave("/v1/chat/completions", leakBody("trickle", true)+strings.Repeat(" ", i), map[string]string{"X-Session-Id": "replaced"}, true)
	})
	// Callers that stay and read nothing of a stream the upstream floods: each write to them
	// stops for client_write_timeout and the call ends, while they are still connected.
	var stuck []*http.Response
	for i := range 8 {
		resp, err := w.client.Do(w.request(key, "/v1/chat/completions", leakBody("flood", true)+strings.Repeat(" ", i), nil))
		if err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, resp)
	}
	waitForWithin(t, leakDeadline, "the calls of callers who read nothing to end", func() bool { return w.h.srv.Residue()["calls"] == 0 })
	for _, resp := range stuck {
		resp.Body.Close()
	}
	w.back("callers leaving at every phase")
}

// TestStormWhileRedisIsDownLeavesNothing: every kind of call, callers leaving mid-stream among
// them, while the gateway's Redis refuses every write; then Redis comes back. What the calls
// left to retry (tallies, lease releases) ends within settle_timeout, and nothing stays.
func TestStormWhileRedisIsDownLeavesNothing(t *testing.T) {
	var down atomic.Bool
	stormWhileRedisFails(t, &down, func(c net.Conn) net.Conn { return blipConn{c, &down} }, "down", 200)
}

// TestStormWhileRedisStallsLeavesNothing is the storm of TestStormWhileRedisIsDownLeavesNothing
// against a Redis that takes every command and answers none (fewer calls: each waits out its
// Redis steps' deadlines).
func TestStormWhileRedisStallsLeavesNothing(t *testing.T) {
	var stalled atomic.Bool
	stormWhileRedisFails(t, &stalled, func(c net.Conn) net.Conn { return swallowConn{c, &stalled} }, "stalled", 64)
}

// swallowConn drops what is written to it while stalled: the server never answers.
type swallowConn struct {
	net.Conn
	stalled *atomic.Bool
}

func (c swallowConn) Write(b []byte) (int, error) {
	if c.stalled.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func stormWhileRedisFails(t *testing.T, down *atomic.Bool, wrap func(net.Conn) net.Conn, how string, calls int) {
	w := leakHarnessOn(t, harnessSetup{redisDialer: wrappedDialer(wrap), contextTimeouts: true},
		stormUpstream(nil), func(c *config.Config) {
			c.Plans["standard"] = stormPlan(c.Plans["standard"])
			c.Limits.SettleTimeout = 3 * time.Second
			c.Limits.UpstreamTimeout = 3 * time.Second // an answer whose connection never closes
		})
	_, key := w.h.user("standard")
	w.warm(key)
	// Named runs opened while Redis answers, so that their later calls are admitted on the hold.
	for i := range 4 {
		resp := w.h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": fmt.Sprintf("down-%d", i)})
		readAll(t, resp.Body)
		resp.Body.Close()
	}
	w.h.settled()
	down.Store(true)
	headers := []func(i int) map[string]string{
		func(int) map[string]string { return nil },
		func(i int) map[string]string { return map[string]string{"X-Run-Id": fmt.Sprintf("down-%d", i%4)} },
		func(i int) map[string]string { return map[string]string{"X-Session-Id": fmt.Sprintf("down-%d", i%3)} },
		func(i int) map[string]string { return map[string]string{"Idempotency-Key": fmt.Sprintf("down-%d", i)} },
	}
	got := w.storm(calls, func(i int) *http.Request {
		mode := []string{"ok", "trickle", "reset-mid", "open"}[i%4]
		req := w.request(key, "/v1/chat/completions", leakBody(mode, i%3 != 0)+strings.Repeat(" ", i), headers[(i/4)%len(headers)](i))
		if mode == "trickle" {
			// The caller leaves mid-stream.
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			t.Cleanup(cancel)
			req = req.WithContext(ctx)
		}
		return req
	})
	t.Logf("with Redis %s: %v", how, got)
	down.Store(false)
	w.back("a storm while Redis was " + how)
}

// waitForWithin is waitFor with a deadline of its own.
func waitForWithin(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
