package main

import "testing"

// The gateway's Redis pool is sized for many concurrent calls unless redis_url says otherwise.
func TestRedisPoolSize(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"redis://127.0.0.1:6379/0", defaultRedisPoolSize},
		{"redis://127.0.0.1:6379/0?pool_size=7", 7},
	} {
		opt, err := redisOptions(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if opt.PoolSize != tc.want {
			t.Errorf("%s: pool size %d, want %d", tc.url, opt.PoolSize, tc.want)
		}
	}
	if _, err := redisOptions("http://nope"); err == nil {
		t.Error("a URL that is not redis:// was accepted")
	}
}
