package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBinaryComesBackToRestAfterStorms: the real `gateway serve`, its pprof on loopback, after a
// warm-up, then storms of wrong keys, unknown models, run names, Idempotency-Keys and streams
// their callers leave mid-way. Once they have ended, and idle connections on both sides are
// closed, its goroutines come back to where they rested (the database pool's watchers aside:
// the pool keeps what it opened, up to its size), within a deadline.
func TestBinaryComesBackToRestAfterStorms(t *testing.T) {
	w := newWorld(t)
	// Credits for every storm: the 200 named runs stay open, each holding its hold, and the
	// plan's allowance refused half of them 402 before they ran.
	credits := int64(1_000_000_000)
	_, key := w.user("storm", 10_000, &credits)
	// pprof on a port of the kernel's choice, read from the gateway's log: one picked free and
	// closed again could be another process's by the time the gateway binds it.
	g, err := w.tryStart("storm", w.config, nil, nil, "-pprof", anyPort)
	if err != nil {
		t.Fatalf("gateway did not start: %v", err)
	}
	pp, err := listenedAt(g.log, "pprof listening", g.done, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	send := func(ctx context.Context, path, key, body string, hdr map[string]string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return client.Do(req)
	}
	// storm sends n calls, eight at a time; each must be answered want (call returns its
	// status, 0 for none): a storm refused before the path it names, or never answered, leaves
	// nothing behind to find and would pass for one that leaks nothing.
	storm := func(what string, n, want int, call func(i int) int) {
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			got = map[int]int{}
		)
		next := make(chan int)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					status := call(i)
					mu.Lock()
					got[status]++
					mu.Unlock()
				}
			}()
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		if got[want] != n {
			t.Fatalf("storm of %s: answers by status %v, want all %d answered %d", what, got, n, want)
		}
	}
	whole := func(path, key, body string, hdr map[string]string) int {
		resp, err := send(context.Background(), path, key, body, hdr)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0
		}
		return resp.StatusCode
	}
	rest := func() {
		client.CloseIdleConnections()
		http.DefaultClient.CloseIdleConnections()
		w.upstream.CloseClientConnections() // the gateway's idle connections to it
	}
	goroutines := func() (n int, dump string) {
		resp, err := http.Get("http://" + pp + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		// Groups "N @ pc..." and their frames; a database connection's watcher is not counted.
		for _, group := range strings.Split(string(b), "\n\n") {
			if first, more, ok := strings.Cut(group, "\n"); ok && strings.HasPrefix(first, "goroutine profile:") {
				group = more
			}
			head, _, _ := strings.Cut(group, " @ ")
			c, err := strconv.Atoi(strings.TrimSpace(head))
			if err != nil || strings.Contains(group, "mysqlConn).startWatcher") {
				continue
			}
			n += c
		}
		return n, string(b)
	}

	whole("/v1/chat/completions", key, string(chatBody(false, 20, "warm")), nil)
	whole("/v1/chat/completions", key, string(chatBody(true, 20, "warm")), map[string]string{"X-Session-Id": "warm"})
	time.Sleep(2 * testHeartbeat) // the heartbeats that follow a first call
	rest()
	var base int
	waitFor(t, 10*time.Second, "the warmed gateway to rest", func() bool {
		rest()
		a, _ := goroutines()
		time.Sleep(200 * time.Millisecond)
		b, _ := goroutines()
		base = b
		return a == b
	})

	storm("wrong keys", 1000, http.StatusUnauthorized, func(i int) int {
		return whole("/v1/chat/completions", fmt.Sprintf("tg_wrong%06d%s", i, strings.Repeat("x", 30)), string(chatBody(false, 20, "hi")), nil)
	})
	storm("unknown models", 3000, http.StatusBadRequest, func(i int) int {
		return whole("/v1/chat/completions", key, fmt.Sprintf(`{"model":"nosuch-%d","messages":[{"role":"user","content":"hi"}]}`, i), nil)
	})
	storm("run names", 200, http.StatusOK, func(i int) int {
		return whole("/v1/chat/completions", key, string(chatBody(false, 20, "run")), map[string]string{"X-Run-Id": fmt.Sprintf("task-%d", i)})
	})
	storm("Idempotency-Keys", 200, http.StatusOK, func(i int) int {
		return whole("/v1/chat/completions", key, string(chatBody(i%2 == 0, 20, "idem")), map[string]string{"Idempotency-Key": fmt.Sprintf("idem-%d", i)})
	})
	storm("streams left mid-way", 100, http.StatusOK, func(i int) int {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hdr := map[string]string{"X-Fake-Chunks": "200", "X-Fake-Chunk-Interval": "20ms"}
		if i%2 == 0 {
			hdr["X-Session-Id"] = fmt.Sprintf("left-%d", i%5)
		}
		resp, err := send(ctx, "/v1/chat/completions", key, string(chatBody(true, 300, fmt.Sprintf("leave %d", i))), hdr)
		if err != nil {
			return 0
		}
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		cancel()
		resp.Body.Close()
		if _, shared := hdr["X-Session-Id"]; shared && resp.StatusCode == http.StatusConflict && strings.Contains(line, `"superseded"`) {
			// Five sessions share these messages: one replaced by a newer message of its
			// session before its answer began is told so, as it must be — answered.
			return http.StatusOK
		}
		return resp.StatusCode
	})

	var last int
	var dump string
	deadline := time.Now().Add(30 * time.Second)
	for {
		rest()
		if last, dump = goroutines(); last <= base+4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway has %d goroutines after the storms ended, %d at rest:\n%s", last, base, dump)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("goroutines: %d at rest, %d after the storms", base, last)
}
