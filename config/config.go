// Package config is tollgate's one typed configuration: a YAML file, then environment
// overrides for what differs per deployment (secrets, addresses), then validation that names
// the setting and what is wrong, so a bad deploy stops at start and not at the first request.
package config

import (
	"errors"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/tollgate/tollgate/pricing"
)

// Config is everything the gateway reads at start.
type Config struct {
	ListenAddr string `yaml:"listen_addr"`
	MySQLDSN   string `yaml:"mysql_dsn"`
	RedisURL   string `yaml:"redis_url"`
	AdminToken string `yaml:"admin_token"`
	Instance   string `yaml:"instance"` // names this process in leases and locks; default host:pid
	// RedisKeyPrefix lets several deployments (or test gateways) share one Redis without
	// seeing each other's tallies, leases and reconcile lock. Empty in production.
	RedisKeyPrefix string `yaml:"redis_key_prefix"`
	// RedisAllowEviction lets the gateway start on a Redis that may evict keys before their
	// TTL (a memory limit with a policy other than noeviction), or whose policy it cannot read.
	// Off by default: an evicted key breaks charge-once (see runstate.MemoryPolicy).
	RedisAllowEviction bool `yaml:"redis_allow_eviction"`
	// RedisCluster says redis_url names a Redis Cluster: its host, and any more seed nodes as
	// addr=host:port parameters (go-redis's ParseClusterURL). The gateway then opens a Cluster
	// client; every key of a run, and every key of one user, carries its owner as Redis
	// Cluster's hash tag, so each multi-key step stays in one slot (runstate.Keys).
	RedisCluster bool  `yaml:"redis_cluster"`
	CreditMicro  int64 `yaml:"credit_micro"` // micro-USD per credit
	// badRedisClusterEnv is a REDIS_CLUSTER that is no boolean, for validate to name: dropped,
	// it left the gateway opening a Cluster's seed node as one server.
	badRedisClusterEnv string

	Limits Limits          `yaml:"limits"`
	Holds  Holds           `yaml:"holds"`
	Dedup  Dedup           `yaml:"dedup"`
	Plans  map[string]Plan `yaml:"plans"`
	// DefaultPlan is the plan of a user created without one, and the terms of a user whose
	// plan is no longer configured (never an unlimited account). It must name a plan.
	DefaultPlan string              `yaml:"default_plan"`
	Upstreams   []Upstream          `yaml:"upstreams"`
	Models      map[string]ModelCfg `yaml:"models"`
}

// Limits bounds everything that grows with input.
type Limits struct {
	MaxBodyBytes int64 `yaml:"max_body_bytes"` // request body; past it 413
	// MaxBodyMemory bounds the request bodies one process holds at once, read and kept for
	// their calls, and MaxBodyMemoryPerCaller one caller's share of them: without them a caller
	// with any valid key could open connections until their bodies exhausted the host's memory,
	// and the process killed by it would leave every call in flight to the reconciler. 0 (the
	// default) derives them from MaxBodyBytes: see BodyMemoryBounds.
	MaxBodyMemory          int64 `yaml:"max_body_memory"`
	MaxBodyMemoryPerCaller int64 `yaml:"max_body_memory_per_caller"`
	MaxEventBytes          int   `yaml:"max_event_bytes"`    // one SSE event from upstream
	MaxResponseBytes       int64 `yaml:"max_response_bytes"` // a non-streamed upstream body
	// MaxResponseMemory bounds the non-streamed answers one process holds at once, read whole
	// before they are relayed (up to MaxResponseBytes each): for the reason MaxBodyMemory bounds
	// request bodies. MaxResponseMemoryPerCaller is one caller's share of it: an answer is
	// held until its caller has read it, so one caller reading slowly would otherwise hold
	// answers of MaxResponseBytes by the max_in_flight, turning every other caller's away.
	// 0 (the default) derives them: see ResponseMemoryBound and ResponseMemoryPerCaller.
	MaxResponseMemory          int64         `yaml:"max_response_memory"`
	MaxResponseMemoryPerCaller int64         `yaml:"max_response_memory_per_caller"`
	UpstreamTimeout            time.Duration `yaml:"upstream_timeout"` // a whole upstream call, stream included
	HeaderTimeout              time.Duration `yaml:"header_timeout"`   // a streamed call's upstream response headers
	// ClientWriteTimeout bounds one write to the caller: a client that takes nothing for this
	// long has stopped reading, and its call ends as cancelled instead of keeping its hold.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	AdmitTimeout       time.Duration `yaml:"admit_timeout"`    // a call's steps before forwarding together, from its body read whole: its admission's wait for the batch writer and its batch's (retries included), an Idempotency-Key's lookups and next attempts, a session's claim, a fingerprint's check; a stalled COMMIT up to the DSN's readTimeout more; then 503, and a hold or claim granted past it is released at 0, never forwarded
	SettleTimeout      time.Duration `yaml:"settle_timeout"`   // one settlement including its retries
	ShutdownTimeout    time.Duration `yaml:"shutdown_timeout"` // graceful drain on SIGTERM
	KeyCacheTTL        time.Duration `yaml:"key_cache_ttl"`    // API key lookups and refusals cached in process
}

// Holds sets admission and expiry.
type Holds struct {
	HoldTTL           time.Duration `yaml:"hold_ttl"`
	RunTTL            time.Duration `yaml:"run_ttl"`
	LeaseTTL          time.Duration `yaml:"lease_ttl"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	ReconcileLockTTL  time.Duration `yaml:"reconcile_lock_ttl"`
	ReconcileBatch    int           `yaml:"reconcile_batch"`
	TallyTTL          time.Duration `yaml:"tally_ttl"`
	// FindDeadInstances keeps this process's row in the database (holds.Instance) and has its
	// reconciler settle the holds of processes found dead without waiting for hold_ttl. Off,
	// its holds wait for their expiry if it is killed, and it sweeps nobody's.
	FindDeadInstances bool `yaml:"find_dead_instances"`
	// DeadInstanceAfter is how long a process's heartbeat in the database may stop before a
	// reconciler declares it dead. 0: DeadInstanceBound derives it.
	DeadInstanceAfter time.Duration `yaml:"dead_instance_after"`
}

// Dedup sets the duplicate-request window.
type Dedup struct {
	Window       time.Duration `yaml:"window"`         // same user, route and body while the first is unanswered, at most this long: a duplicate; 0 turns it off
	FailOpen     bool          `yaml:"fail_open"`      // Redis unreachable: let requests through instead of 503
	ReplayTTL    time.Duration `yaml:"replay_ttl"`     // stored responses for Idempotency-Key replays
	MaxReplayLen int64         `yaml:"max_replay_len"` // largest stored response
	// MaxReplayBytesPerCaller bounds what one caller's stored responses hold in Redis at once;
	// 0 derives it (ReplayBytesPerCaller).
	MaxReplayBytesPerCaller int64 `yaml:"max_replay_bytes_per_caller"`
}

// Plan is what a class of users gets. Credits are converted to micro-USD at load.
type Plan struct {
	AllowanceCredits  Credits `yaml:"allowance_credits"`
	HoldNormalCredits Credits `yaml:"hold_normal_credits"`
	HoldHeavyCredits  Credits `yaml:"hold_heavy_credits"`
	HeavyAfterTurns   int     `yaml:"heavy_after_turns"`
	MaxInFlight       int     `yaml:"max_in_flight"`
	MaxRunCostCredits Credits `yaml:"max_run_cost_credits"`
	DiscountBP        int     `yaml:"discount_bp"`
}

// LongContextCfg is a model's long-context price: input, output and above_prompt_tokens must
// be written; a cache price left out is its input price, as a model's is; a one-hour write or
// audio price must be written when the model prices its own (checkLongParts), and left out
// otherwise bills those tokens at their whole's long price (cache_write, input, output).
type LongContextCfg struct {
	// AbovePromptTokens is the line: a prompt of more tokens than this (input, cache reads and
	// cache writes together) bills the whole call at the prices below.
	AbovePromptTokens int64   `yaml:"above_prompt_tokens"`
	Input             USDPerM `yaml:"input"`
	CacheRead         USDPerM `yaml:"cache_read"`
	CacheWrite        USDPerM `yaml:"cache_write"`
	CacheWrite1h      USDPerM `yaml:"cache_write_1h"`
	AudioInput        USDPerM `yaml:"audio_input"`
	AudioOutput       USDPerM `yaml:"audio_output"`
	Output            USDPerM `yaml:"output"`
}

// Upstream is one provider endpoint.
type Upstream struct {
	Name      string   `yaml:"name"`
	Kind      string   `yaml:"kind"` // "openai" or "anthropic"
	BaseURL   string   `yaml:"base_url"`
	APIKeyEnv string   `yaml:"api_key_env"` // environment variable holding the key; keys never live in files
	APIKey    string   `yaml:"-"`
	Models    []string `yaml:"models"` // exact names or prefixes ending in "*"; "*" serves every priced model
}

// ModelCfg prices one model (USD per million tokens, decimal text) and bounds its output.
type ModelCfg struct {
	Input      USDPerM `yaml:"input"`
	CacheRead  USDPerM `yaml:"cache_read"`
	CacheWrite USDPerM `yaml:"cache_write"`
	// CacheWrite1h prices Anthropic's one-hour cache writes (cache_control ttl "1h"); unset,
	// requests asking for them are refused (unpriced_option).
	CacheWrite1h USDPerM `yaml:"cache_write_1h"`
	// AudioInput prices audio input tokens (chat input_audio parts); unset, requests with
	// audio parts are refused (unpriced_option).
	AudioInput USDPerM `yaml:"audio_input"`
	// AudioOutput prices audio output tokens (a chat answer asked for with modalities
	// ["text", "audio"]); unset, requests asking for audio answers are refused (unpriced_option).
	AudioOutput     USDPerM `yaml:"audio_output"`
	Output          USDPerM `yaml:"output"`
	MaxOutputTokens int64   `yaml:"max_output_tokens"` // the model's own limit; 0 = unknown
	// LongContext prices the calls whose prompt passes a line at other rates (Gemini 2.5 Pro,
	// Claude's 1M-context beta: past 200 000 prompt tokens every token of the call costs
	// more); left out, the model has one price at every length, and Anthropic's context-1m
	// beta is refused (unpriced_option).
	LongContext LongContextCfg `yaml:"long_context"`
	// OutputBoundField is the field a chat request that sets no output bound is given one in
	// (when max_output_tokens is set and the worst case would pass the cap): max_tokens, the
	// default, which every OpenAI-compatible server reads, or max_completion_tokens, which
	// OpenAI's reasoning models (o1, o3, o4-mini, gpt-5) require: they refuse max_tokens.
	OutputBoundField string `yaml:"output_bound_field"`
}

// Load reads path (empty: defaults only), applies the environment, and validates.
func Load(path string) (*Config, error) { return load(path, true) }

// LoadWithoutRedis is Load for a command that uses the database alone (migrate, audit, the
// admin commands): an empty redis_url is no mistake there, and an operator running an audit
// from a host that has only the database need not invent one. One that is set is still
// checked.
func LoadWithoutRedis(path string) (*Config, error) { return load(path, false) }

func load(path string, needRedis bool) (*Config, error) {
	cfg := Default()
	var unwritten []error // what a typed decode cannot see: settings left out or empty, fractions dropped
	var told []string     // the settings unwritten names, which validate need not name again
	if path != "" {
		var err error
		if unwritten, told, err = decodeFile(path, cfg); err != nil {
			return nil, err
		}
	}
	cfg.applyEnv(os.Getenv)
	if err := errors.Join(append(unwritten, cfg.validate(needRedis, told))...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// PriceTable builds the pricing table from the models section.
func (c *Config) PriceTable() (*pricing.Table, error) {
	prices := make(map[string]pricing.Price, len(c.Models))
	for name, m := range c.Models {
		p := pricing.Price{Input: m.Input.Micro, CacheRead: m.CacheRead.Micro, CacheWrite: m.CacheWrite.Micro,
			CacheWrite1h: m.CacheWrite1h.Micro, AudioInput: m.AudioInput.Micro,
			AudioOutput: m.AudioOutput.Micro, Output: m.Output.Micro}
		if l := m.LongContext; l != (LongContextCfg{}) {
			p.Long = &pricing.Price{Input: l.Input.Micro, CacheRead: l.CacheRead.Micro, CacheWrite: l.CacheWrite.Micro,
				CacheWrite1h: l.CacheWrite1h.Micro, AudioInput: l.AudioInput.Micro,
				AudioOutput: l.AudioOutput.Micro, Output: l.Output.Micro}
			p.LongAbove = l.AbovePromptTokens
		}
		prices[name] = p
	}
	return pricing.NewTable(prices)
}

// Plan returns the named plan; unknown plans get the default plan's terms so a typo in the
// users table never hands out an unlimited account.
func (c *Config) Plan(name string) Plan {
	if p, ok := c.Plans[name]; ok {
		return p
	}
	return c.Plans[c.DefaultPlan]
}

// UpstreamFor returns the first upstream that serves model: exact name, then a "prefix*"
// entry, then "*".
func (c *Config) UpstreamFor(model string) (*Upstream, bool) {
	for _, pass := range []func(string) bool{
		func(m string) bool { return m == model },
		func(m string) bool {
			return isModelPrefix(m) && strings.HasPrefix(model, strings.TrimSuffix(m, "*"))
		},
		func(m string) bool { return m == "*" },
	} {
		for i := range c.Upstreams {
			for _, m := range c.Upstreams[i].Models {
				if pass(m) {
					return &c.Upstreams[i], true
				}
			}
		}
	}
	return nil, false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
