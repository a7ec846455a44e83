package proxy_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestPlainCallRedisRoundTrips: on a saturated box every round trip to Redis costs the gateway
// a write and a read on a socket and a wake-up, and Redis its share of the CPU. A plain call,
// streamed or not, makes two: its fingerprint (SET NX) before forwarding, then one round trip
// that gives the fingerprint back and writes the call's tally, before the end of the answer
// goes out — so the tally is in Redis when the caller has its answer — and the release of a
// lease no heartbeat wrote costs nothing.
func TestPlainCallRedisRoundTrips(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	reader := redis.NewClient(h.rdb.Options()) // the test's own reads, not counted
	t.Cleanup(func() { reader.Close() })
	log := &tripLog{}
	h.rdb.AddHook(log)

	call := func(body string) (trips [][]string) {
		t.Helper()
		before := log.len()
		a := sendOK(t, "call", h.gw.URL, key, body, nil)
		runID := a.header.Get("X-Tollgate-Run-Id")
		if n, err := reader.Exists(context.Background(), h.keys.Usage(runID)).Result(); err != nil || n != 1 {
			t.Fatalf("run %s has no tally when its caller has the answer (%d, %v)", runID, n, err)
		}
		h.settled()
		return log.since(before)
	}
	// The first calls load the scripts (EVALSHA, then EVAL on NOSCRIPT).
	call(`{"model":"fake-gpt","messages":[{"role":"user","content":"warm up"}]}`)
	call(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"warm up too"}]}`)

	got := call(`{"model":"fake-gpt","messages":[{"role":"user","content":"hello"}]}`)
	if len(got) != 2 {
		t.Fatalf("non-streamed plain call: %d round trips to Redis, want 2: %v", len(got), got)
	}
	if !slices.Contains(got[0], "set") {
		t.Errorf("first round trip %v is not the fingerprint's SET NX", got[0])
	}
	// Two scripts: the fingerprint's compare-and-delete and the tally's numbered write.
	if evals := countEvals(got[1]); evals != 2 {
		t.Errorf("second round trip %v does not both give the fingerprint back and write the tally", got[1])
	}

	if got := call(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"count to ten"}]}`); len(got) != 2 {
		t.Fatalf("streamed plain call: %d round trips to Redis, want 2: %v", len(got), got)
	}
}

// tripLog records the command names of every round trip a client makes.
type tripLog struct {
	mu    sync.Mutex
	trips [][]string
}

func (l *tripLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.trips)
}

func (l *tripLog) since(i int) [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.trips[i:])
}

func (l *tripLog) add(cmds ...redis.Cmder) {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = strings.ToLower(c.Name())
	}
	l.mu.Lock()
	l.trips = append(l.trips, names)
	l.mu.Unlock()
}

func (l *tripLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *tripLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *tripLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.add(cmds...)
		return next(ctx, cmds)
	}
}

// countEvals counts the scripts among the command names of a round trip.
func countEvals(names []string) int {
	n := 0
	for _, name := range names {
		if name == "eval" || name == "evalsha" {
			n++
		}
	}
	return n
}
