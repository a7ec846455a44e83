package main

import (
	"strings"
	"testing"
)

// TestRedisPoolSizeOutOfBoundsStopsTheStart: README § Configuration says a wrong setting stops
// the gateway with a message naming it, and that the Redis pool is 128 connections unless
// redis_url's ?pool_size= says otherwise. go-redis takes any integer there: a negative one
// panicked `serve` and `reconcile -once` with "makechan: size out of range" and a goroutine
// dump (go-redis's semaphore), and a huge one (100000000) ran the process out of memory
// before it served anything (go-redis sizes its pool's slices by it) — neither naming the
// setting. A pool_size outside 1–10000 (0 is the gateway's 128, as unset) is refused with
// redis_url and pool_size named, on one server and on a Cluster (per node) alike.
func TestRedisPoolSizeOutOfBoundsStopsTheStart(t *testing.T) {
	for _, q := range []string{"pool_size=-1", "pool_size=10001", "pool_size=100000000"} {
		if _, err := redisOptions("redis://127.0.0.1:6379/0?" + q); err == nil || !strings.Contains(err.Error(), "pool_size") {
			t.Errorf("redis_url ?%s: %v, want it refused naming pool_size", q, err)
		}
		if _, err := redisClusterOptions("redis://127.0.0.1:6379?" + q); err == nil || !strings.Contains(err.Error(), "pool_size") {
			t.Errorf("cluster redis_url ?%s: %v, want it refused naming pool_size", q, err)
		}
	}
	for q, want := range map[string]int{"pool_size=0": defaultRedisPoolSize, "pool_size=1": 1, "pool_size=10000": 10000} {
		opt, err := redisOptions("redis://127.0.0.1:6379/0?" + q)
		if err != nil || opt.PoolSize != want {
			t.Errorf("redis_url ?%s: %v, pool %v, want %d", q, err, opt, want)
		}
		copt, err := redisClusterOptions("redis://127.0.0.1:6379?" + q)
		if err != nil || copt.PoolSize != want {
			t.Errorf("cluster redis_url ?%s: %v, want pool %d", q, err, want)
		}
	}
}
