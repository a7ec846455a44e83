package config

import (
	"time"

	"github.com/go-sql-driver/mysql"
)

// Default is a working configuration for the built-in fake upstream.
func Default() *Config {
	return &Config{
		ListenAddr:  "127.0.0.1:8080",
		CreditMicro: 1000,
		Limits: Limits{
			MaxBodyBytes:       4 << 20,
			MaxEventBytes:      8 << 20,
			MaxResponseBytes:   32 << 20,
			UpstreamTimeout:    300 * time.Second,
			HeaderTimeout:      120 * time.Second,
			ClientWriteTimeout: 60 * time.Second,
			AdmitTimeout:       5 * time.Second,
			SettleTimeout:      30 * time.Second,
			ShutdownTimeout:    30 * time.Second,
			KeyCacheTTL:        2 * time.Second,
		},
		Holds: Holds{
			HoldTTL:           900 * time.Second,
			RunTTL:            900 * time.Second,
			LeaseTTL:          30 * time.Second,
			HeartbeatInterval: 10 * time.Second,
			ReconcileInterval: 60 * time.Second,
			ReconcileLockTTL:  50 * time.Second,
			ReconcileBatch:    200,
			TallyTTL:          48 * time.Hour,
			FindDeadInstances: true,
		},
		Dedup:       Dedup{Window: 5 * time.Second, ReplayTTL: 24 * time.Hour, MaxReplayLen: 1 << 20},
		DefaultPlan: "standard",
		Plans: map[string]Plan{
			"standard": {AllowanceCredits: CreditsOf(2000), HoldNormalCredits: CreditsOf(20), HoldHeavyCredits: CreditsOf(60),
				HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostCredits: CreditsOf(500)},
			"guest": {AllowanceCredits: CreditsOf(100), HoldNormalCredits: CreditsOf(20), HoldHeavyCredits: CreditsOf(60),
				HeavyAfterTurns: 4, MaxInFlight: 3, MaxRunCostCredits: CreditsOf(500)},
		},
		Upstreams: []Upstream{{Name: "fakellm", Kind: "openai", BaseURL: "http://127.0.0.1:9090", Models: []string{"*"}}},
		Models: map[string]ModelCfg{
			"fake-gpt": {Input: mustUSD("2.50"), CacheRead: mustUSD("1.25"), CacheWrite: mustUSD("3.125"), Output: mustUSD("10.00")},
		},
	}
}

// defaultDeadInstanceAfter is the dead-instance bound when the configuration leaves it 0 and
// the heartbeat settings allow it.
const defaultDeadInstanceAfter = 90 * time.Second

// DeadInstanceBound is the dead-instance bound in force: the configured one, or when that is
// 0, defaultDeadInstanceAfter or the least the heartbeat settings allow, whichever is more (a
// configuration with slow heartbeats that started before the bound existed still starts).
func (h Holds) DeadInstanceBound() time.Duration {
	if h.DeadInstanceAfter != 0 {
		return h.DeadInstanceAfter
	}
	return max(defaultDeadInstanceAfter, h.leastDeadInstanceAfter())
}

// leastDeadInstanceAfter is the shortest dead-instance bound the heartbeat settings allow. The
// holds of a process declared dead while its leases live are left to their expiry: the bound
// must outlast the leases of its last heartbeat, or a killed process's calls wait for their
// expiry after all. And a hold is brought in only if admitted before its process's last beat
// plus the gap its beats allow (two intervals and a beat's 5 s bound, holds.Instance): one
// heartbeat more, and a live process has written the lease of every such call.
func (h Holds) leastDeadInstanceAfter() time.Duration {
	return max(h.LeaseTTL+2*h.HeartbeatInterval, 3*h.HeartbeatInterval+5*time.Second)
}

// Derived bounds on request bodies in memory (BodyMemoryBounds).
const (
	// defaultMaxBodyMemory is the process's bound unless max_body_bytes asks for more room.
	defaultMaxBodyMemory = 512 << 20
	// bodyMemoryShares is how many callers it takes, each holding its whole share, to fill
	// the process's bound: with a large share a few callers sending slow bodies (1 KiB/s, up
	// to an hour for 4 MiB) turned away every other caller's requests for as long.
	bodyMemoryShares = 16
)

// BodyMemoryBounds returns the bounds on request bodies held in memory: the process's and one
// caller's, as configured, or derived where 0 — the process's defaultMaxBodyMemory or four
// largest bodies if more, a caller's a bodyMemoryShares-th of it or one largest body if more.
// Derived, they fit every max_body_bytes a configuration could have before they existed.
func (l Limits) BodyMemoryBounds() (total, perCaller int64) {
	total, perCaller = l.MaxBodyMemory, l.MaxBodyMemoryPerCaller
	if total == 0 {
		total = max(defaultMaxBodyMemory, 4*l.MaxBodyBytes)
	}
	if perCaller == 0 {
		perCaller = min(total, max(l.MaxBodyBytes, total/bodyMemoryShares))
	}
	return total, perCaller
}

// replayShares is how many answers of max_replay_len one caller's stored answers may hold
// unless max_replay_bytes_per_caller says otherwise (ReplayBytesPerCaller).
const replayShares = 64

// ReplayRecordOverhead is what a kept answer's record costs Redis beyond the answer's bytes:
// the key, the hash's fields (run, attempt, body hash, status, content type) and the
// allocator's rounding, measured at 0.6–0.8 KB on Redis 7.0 (README, Sizing Redis). Counted
// with each answer, a caller's share bounds the memory its kept answers take, not only their
// bytes: 64 MiB of 452-byte answers was otherwise about 180 MB of Redis.
const ReplayRecordOverhead = 1024

// ReplayBytesPerCaller is the bound on what one caller's answers kept for Idempotency-Key
// replays hold in Redis at once: as configured, or replayShares answers of max_replay_len.
// Unbounded, a caller sending each request under a new key kept up to max_replay_len per call
// for replay_ttl — cheap answers (embeddings) at a gigabyte a minute — until Redis, which must
// not evict (noeviction), was full and refused every write of the money path.
func (d Dedup) ReplayBytesPerCaller() int64 {
	if d.MaxReplayBytesPerCaller != 0 {
		return d.MaxReplayBytesPerCaller
	}
	return replayShares * d.MaxReplayLen
}

// defaultMaxResponseMemory is the process's bound on whole answers in memory unless
// max_response_bytes asks for more room (ResponseMemoryBound).
const defaultMaxResponseMemory = 512 << 20

// ResponseMemoryBound returns the bound on non-streamed answers held in memory: as configured,
// or where 0 defaultMaxResponseMemory or four largest answers if more, so that it fits every
// max_response_bytes a configuration could have before it existed.
func (l Limits) ResponseMemoryBound() int64 {
	if l.MaxResponseMemory != 0 {
		return l.MaxResponseMemory
	}
	return max(defaultMaxResponseMemory, 4*l.MaxResponseBytes)
}

// responseMemoryShares is how many callers it takes, each holding its whole share, to fill the
// process's bound on whole answers unless max_response_memory_per_caller says otherwise.
const responseMemoryShares = 16

// ResponseMemoryPerCaller returns one caller's share of the whole answers in memory: as
// configured, or where 0 a responseMemoryShares-th of ResponseMemoryBound or one largest
// answer if more (so that any answer fits a caller holding no other).
func (l Limits) ResponseMemoryPerCaller() int64 {
	if l.MaxResponseMemoryPerCaller != 0 {
		return l.MaxResponseMemoryPerCaller
	}
	total := l.ResponseMemoryBound()
	return min(total, max(l.MaxResponseBytes, total/responseMemoryShares))
}

// DefaultDBReadTimeout is the longest the gateway waits for one reply of the database when the
// DSN sets no readTimeout (holds.Open's default; a test there keeps the two equal, so that
// the configuration need not depend on the database package).
const DefaultDBReadTimeout = 30 * time.Second

// dbReadTimeout is the DSN's readTimeout, else DefaultDBReadTimeout. A DSN that does not
// parse gives the default here: opening the database reports it.
func (c *Config) dbReadTimeout() time.Duration {
	if cfg, err := mysql.ParseDSN(c.MySQLDSN); err == nil && cfg.ReadTimeout > 0 {
		return cfg.ReadTimeout
	}
	return DefaultDBReadTimeout
}
