// Package config is tollgate's one typed configuration: a YAML file, then environment
// overrides for what differs per deployment (secrets, addresses), then validation that names
// the setting and what is wrong, so a bad deploy stops at start and not at the first request.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"gopkg.in/yaml.v3"

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
	RedisAllowEviction bool  `yaml:"redis_allow_eviction"`
	CreditMicro        int64 `yaml:"credit_micro"` // micro-USD per credit

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
	MaxBodyMemory          int64         `yaml:"max_body_memory"`
	MaxBodyMemoryPerCaller int64         `yaml:"max_body_memory_per_caller"`
	MaxEventBytes          int           `yaml:"max_event_bytes"`    // one SSE event from upstream
	MaxResponseBytes       int64         `yaml:"max_response_bytes"` // a non-streamed upstream body
	UpstreamTimeout        time.Duration `yaml:"upstream_timeout"`   // a whole upstream call, stream included
	HeaderTimeout          time.Duration `yaml:"header_timeout"`     // a streamed call's upstream response headers
	// ClientWriteTimeout bounds one write to the caller: a client that takes nothing for this
	// long has stopped reading, and its call ends as cancelled instead of keeping its hold.
	ClientWriteTimeout time.Duration `yaml:"client_write_timeout"`
	AdmitTimeout       time.Duration `yaml:"admit_timeout"`    // one admission including its retries; then 503
	SettleTimeout      time.Duration `yaml:"settle_timeout"`   // one settlement including its retries
	ShutdownTimeout    time.Duration `yaml:"shutdown_timeout"` // graceful drain on SIGTERM
	KeyCacheTTL        time.Duration `yaml:"key_cache_ttl"`    // API key lookups cached in process
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

// DefaultDeadInstanceAfter is the dead-instance bound when the configuration leaves it 0 and
// the heartbeat settings allow it.
const DefaultDeadInstanceAfter = 90 * time.Second

// DeadInstanceBound is the dead-instance bound in force: the configured one, or when that is
// 0, DefaultDeadInstanceAfter or the least the heartbeat settings allow, whichever is more (a
// configuration with slow heartbeats that started before the bound existed still starts).
func (h Holds) DeadInstanceBound() time.Duration {
	if h.DeadInstanceAfter != 0 {
		return h.DeadInstanceAfter
	}
	return max(DefaultDeadInstanceAfter, h.leastDeadInstanceAfter())
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

// Dedup sets the duplicate-request window.
type Dedup struct {
	Window       time.Duration `yaml:"window"`         // same user, route and body while the first is unanswered, at most this long: a duplicate; 0 turns it off
	FailOpen     bool          `yaml:"fail_open"`      // Redis unreachable: let requests through instead of 503
	ReplayTTL    time.Duration `yaml:"replay_ttl"`     // stored responses for Idempotency-Key replays
	MaxReplayLen int64         `yaml:"max_replay_len"` // largest stored response
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
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		// A models or plans section replaces the demo one rather than adding to it (yaml.v3
		// decodes into the existing map): only what the operator priced is priced, and an
		// operator's plans "free" and "pro" do not come with the demo's "standard" (2000
		// credits a day) as every new user's plan.
		defaults, demoPlans := cfg.Models, cfg.Plans
		cfg.Models, cfg.Plans = nil, nil
		if err := dec.Decode(cfg); err != nil {
			if strings.Contains(err.Error(), "into time.Duration") {
				return nil, fmt.Errorf("config %s: %w (a duration needs its unit: 30s, 5m, 48h)", path, err)
			}
			return nil, fmt.Errorf("config %s: %s", path, unknownSettings.ReplaceAllString(err.Error(), `unknown setting "$1" (misspelt, or under the wrong section?)`))
		}
		if cfg.Models == nil {
			cfg.Models = defaults
		}
		if cfg.Plans == nil {
			cfg.Plans = demoPlans
		}
		unwritten, told = checkWritten(raw)
	}
	cfg.applyEnv(os.Getenv)
	if err := errors.Join(append(unwritten, cfg.validate(needRedis, told))...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// unknownSettings is how yaml.v3 words a key no setting has ("field listen_adr not found in
// type config.Config"), which names the Go type where an operator looks for a setting.
var unknownSettings = regexp.MustCompile(`field (\S+) not found in type \S+`)

// requiredModelFields and requiredPlanFields must be written in a config file's models and
// plans: each decodes as 0 when left out, and 0 is a valid amount (a free model, a plan
// without a daily allowance) that nobody meant by leaving the field out.
var (
	requiredModelFields = []string{"input", "output"}
	requiredPlanFields  = []string{"allowance_credits", "hold_normal_credits", "hold_heavy_credits",
		"heavy_after_turns", "max_in_flight", "max_run_cost_credits"}
)

// checkWritten reports what a typed decode cannot see: a fraction in an integer setting, a
// required price or plan field left out, and any price or plan field left empty (`input:` is
// YAML's null, which decodes as 0). It also returns the price and plan fields it named, so
// that the checks of their (zero) values do not name each a second time.
func checkWritten(raw []byte) (errs []error, told []string) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil || len(doc.Content) == 0 {
		return nil, nil // the typed decode has reported it, or the file is empty
	}
	errs = checkWhole(doc.Content[0], reflect.TypeOf(Config{}), "")
	for _, sec := range []struct {
		name     string
		required []string
		// mustBeWritten says whether a field left empty is refused: every plan field, and a
		// model's prices (its bounds' zero values are their documented defaults).
		mustBeWritten func(key string) bool
	}{{"models", requiredModelFields, isModelPrice}, {"plans", requiredPlanFields, func(string) bool { return true }}} {
		entries := mappingValue(doc.Content[0], sec.name)
		if entries == nil || entries.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(entries.Content); i += 2 {
			at := sec.name + "." + entries.Content[i].Value
			fields := entries.Content[i+1]
			if fields.Kind == yaml.AliasNode {
				fields = fields.Alias // pro: *standard, the same fields
			}
			if fields.Kind != yaml.MappingNode {
				errs = append(errs, fmt.Errorf("%s: line %d: must be a mapping of its fields", at, fields.Line))
				continue
			}
			for j := 0; j+1 < len(fields.Content); j += 2 {
				if v := fields.Content[j+1]; v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" && sec.mustBeWritten(fields.Content[j].Value) {
					errs = append(errs, fmt.Errorf("%s.%s: line %d: is empty; write 0 if 0 is meant", at, fields.Content[j].Value, v.Line))
					told = append(told, at+"."+fields.Content[j].Value)
				}
			}
			for _, f := range sec.required {
				if mappingValue(fields, f) == nil {
					errs = append(errs, fmt.Errorf("%s.%s: line %d: is missing (every %s entry sets it; write 0 if 0 is meant)", at, f, fields.Line, sec.name))
					told = append(told, at+"."+f)
				}
			}
		}
	}
	return errs, told
}

// isModelPrice reports whether key names a price field of a models entry.
func isModelPrice(key string) bool {
	t := reflect.TypeOf(ModelCfg{})
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == key {
			return t.Field(i).Type == reflect.TypeOf(USDPerM{})
		}
	}
	return false
}

// checkWhole reports an integer setting not written in plain decimal digits: YAML decodes 12.5
// into an int as 12 and 0200 as 128, silently. n is the node decoded into a value of type t,
// named at (its YAML path).
func checkWhole(n *yaml.Node, t reflect.Type, at string) []error {
	var errs []error
	join := func(key string) string {
		if at == "" {
			return key
		}
		return at + "." + key
	}
	switch {
	case n.Kind == yaml.ScalarNode:
		if t != reflect.TypeOf(time.Duration(0)) && t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64 &&
			n.ShortTag() != "!!null" && !plainInteger(n.Value) {
			errs = append(errs, fmt.Errorf("%s: line %d: %s is not a whole number in decimal digits (YAML drops a fraction and reads 0200 as octal)", at, n.Line, n.Value))
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		for i := 0; i+1 < len(n.Content); i += 2 {
			for f := range t.NumField() {
				if tag, _, _ := strings.Cut(t.Field(f).Tag.Get("yaml"), ","); tag == n.Content[i].Value {
					errs = append(errs, checkWhole(n.Content[i+1], t.Field(f).Type, join(tag))...)
				}
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, checkWhole(n.Content[i+1], t.Elem(), join(n.Content[i].Value))...)
		}
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for i, e := range n.Content {
			errs = append(errs, checkWhole(e, t.Elem(), fmt.Sprintf("%s[%d]", at, i))...)
		}
	}
	return errs
}

// plainInteger reports whether s is an integer as an operator means it: decimal digits, an
// optional sign, no leading zero (which YAML reads as octal), no fraction, exponent or base.
func plainInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// mappingValue is the value of key in mapping node m, or nil: written in m itself, or in a
// mapping m takes through a merge key (`<<: *base`, `<<: [*a, *b]`).
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m.Kind == yaml.AliasNode {
		m = m.Alias
	}
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	var merged []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		switch k, v := m.Content[i], m.Content[i+1]; {
		case k.ShortTag() == "!!merge" && v.Kind == yaml.SequenceNode:
			merged = append(merged, v.Content...)
		case k.ShortTag() == "!!merge":
			merged = append(merged, v)
		case k.Value == key:
			return v
		}
	}
	for _, from := range merged {
		if v := mappingValue(from, key); v != nil {
			return v
		}
	}
	return nil
}

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

// applyEnv overrides the settings that differ per deployment. UPSTREAM_URL and
// UPSTREAM_API_KEY apply to the first upstream, the one a single-upstream setup has, and to
// every other upstream at the same base_url: one provider reached in both wire formats (the
// demo's fake upstream serves OpenAI and Anthropic routes).
func (c *Config) applyEnv(getenv func(string) string) {
	set := func(dst *string, name string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	set(&c.MySQLDSN, "MYSQL_DSN")
	set(&c.RedisURL, "REDIS_URL")
	set(&c.ListenAddr, "LISTEN_ADDR")
	set(&c.AdminToken, "ADMIN_TOKEN")
	set(&c.Instance, "TOLLGATE_INSTANCE")
	set(&c.RedisKeyPrefix, "TOLLGATE_REDIS_PREFIX")
	if len(c.Upstreams) > 0 {
		first := c.Upstreams[0]
		for i := range c.Upstreams {
			if u := &c.Upstreams[i]; i == 0 || u.BaseURL == first.BaseURL {
				set(&u.BaseURL, "UPSTREAM_URL")
				// An upstream that names a key of its own (another account at the same
				// provider) keeps it: it shares the first's key only when it names the same
				// variable or none.
				if i == 0 || u.APIKeyEnv == "" || u.APIKeyEnv == first.APIKeyEnv {
					set(&u.APIKey, "UPSTREAM_API_KEY")
				}
			}
		}
	}
	for i := range c.Upstreams {
		if u := &c.Upstreams[i]; u.APIKeyEnv != "" && u.APIKey == "" {
			u.APIKey = getenv(u.APIKeyEnv)
		}
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
}

// Warnings lists settings that are valid but weaken a guarantee, for the log at start. A
// hold shorter than the longest call stops counting in flight when it expires while its call
// still runs (the reconciler pushes a leased hold out, but only at its next pass; what it
// holds counts against the balance until it settles), so in that window a user may be
// admitted past max_in_flight. The
// defaults keep every hold 2.5 times the longest call; tests shorten them on purpose.
func (c *Config) Warnings() []string {
	longest := c.Limits.UpstreamTimeout + c.Limits.ClientWriteTimeout
	var out []string
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"holds.hold_ttl", c.Holds.HoldTTL}, {"holds.run_ttl", c.Holds.RunTTL}} {
		if t.d < longest {
			out = append(out, fmt.Sprintf("%s %v is shorter than the longest call (upstream_timeout + client_write_timeout = %v): "+
				"a call that outlives its hold stops counting against max_in_flight until the reconciler extends it", t.name, t.d, longest))
		}
	}
	if c.Limits.HeaderTimeout >= c.Limits.UpstreamTimeout {
		out = append(out, fmt.Sprintf("limits.header_timeout %v is not shorter than limits.upstream_timeout %v: the whole call is cut first, so it never applies",
			c.Limits.HeaderTimeout, c.Limits.UpstreamTimeout))
	}
	for _, name := range sortedKeys(c.Models) {
		if !c.served(name) {
			out = append(out, fmt.Sprintf("models.%s is priced but no upstream serves it: requests for it are refused (model_not_served)", name))
		}
	}
	return out
}

// served reports whether some upstream serves priced name, or a model it prices as a prefix.
func (c *Config) served(name string) bool {
	if _, ok := c.UpstreamFor(name); ok {
		return true
	}
	for _, u := range c.Upstreams {
		for _, m := range u.Models {
			if m != "*" && strings.HasPrefix(strings.TrimSuffix(m, "*"), name) {
				return true
			}
		}
	}
	return false
}

// maxPlanMilli bounds a plan amount: 10^12 credits in thousandths, and (scaled by
// credit_micro) 10^15 micro-USD, so that sums of allowances, prepaid credits and holds stay far
// inside int64.
const maxPlanMilli = 1_000_000_000_000_000

// Validate reports every wrong setting at once, each named by its YAML path.
func (c *Config) Validate() error { return c.validate(true, nil) }

// validate is Validate; needRedis false lets redis_url be empty (LoadWithoutRedis). A setting
// matched by a pattern in told (a field the file left out, already named with its line) is
// not named again: "plans.pro.hold_*_credits: need 0 < ..." under "plans.pro.hold_normal_credits:
// is missing" says the same thing twice.
func (c *Config) validate(needRedis bool, told []string) error {
	var errs []error
	bad := func(setting, format string, args ...any) {
		for _, t := range told {
			if names(setting, t) {
				return
			}
		}
		errs = append(errs, fmt.Errorf("%s: %s", setting, fmt.Sprintf(format, args...)))
	}
	c.checkService(bad, needRedis)
	c.checkHoldTimes(bad)
	c.checkSizes(bad)
	c.checkDedup(bad)
	c.checkTimeouts(bad)
	c.checkPlans(bad)
	prices := c.checkModels(bad)
	c.checkUpstreams(bad, prices)
	return errors.Join(errs...)
}

// names reports whether setting names field: the same path, or a path whose one * stands for
// a part of one key (plans.pro.hold_*_credits names plans.pro.hold_normal_credits; the model
// "gpt-*" is not a pattern over the fields of the model "gpt-x").
func names(setting, field string) bool {
	before, after, wild := strings.Cut(setting, "*")
	if !wild {
		return setting == field
	}
	if len(field) < len(before)+len(after) || !strings.HasPrefix(field, before) || !strings.HasSuffix(field, after) {
		return false
	}
	return !strings.Contains(field[len(before):len(field)-len(after)], ".")
}

// complain records one wrong setting: its YAML path (and variable) and what is wrong with it.
type complain func(setting, format string, args ...any)

// checkService checks where the gateway listens, what it connects to and its money unit.
func (c *Config) checkService(bad complain, needRedis bool) {
	if c.ListenAddr == "" {
		bad("listen_addr (LISTEN_ADDR)", "is empty")
	} else if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		bad("listen_addr (LISTEN_ADDR)", "%q is not host:port (127.0.0.1:8080, or :8080 for every interface)", c.ListenAddr)
	}
	if c.MySQLDSN == "" {
		bad("mysql_dsn (MYSQL_DSN)", "is empty; e.g. tollgate:tollgate@tcp(127.0.0.1:3306)/tollgate")
	}
	if c.RedisURL == "" {
		if needRedis {
			bad("redis_url (REDIS_URL)", "is empty; e.g. redis://127.0.0.1:6379/0")
		}
	} else if u, err := url.Parse(c.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		bad("redis_url (REDIS_URL)", "%q is not a redis:// or rediss:// URL", redactURL(c.RedisURL))
	} else if redisURLAtPastHost(u) {
		bad("redis_url (REDIS_URL)", "%q has an '@' after its host: a password or user name holding '/', '?' or '#' must be "+
			"percent-encoded (%%2F, %%3F, %%23)", redactURL(c.RedisURL))
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		bad("admin_token (ADMIN_TOKEN)", "is shorter than 16 bytes")
	}
	if !sendableSecret(c.AdminToken) {
		bad("admin_token (ADMIN_TOKEN)", "has white space at either end or a control character (a newline kept from a secret file?): "+
			"the admin API trims the token a caller sends, so this one could never be matched")
	}
	if c.CreditMicro <= 0 {
		bad("credit_micro", "must be positive, got %d", c.CreditMicro)
	} else if !pricing.ExactCreditMicro(c.CreditMicro) {
		// 1 micro-USD would be 1/credit_micro credits, which no decimal shows exactly: reports
		// and balances would drift from the ledger.
		bad("credit_micro", "must be a product of 2s and 5s (1000, 10000, 5000000, ...) so that credits are exact decimals, got %d", c.CreditMicro)
	}
}

// checkHoldTimes checks the durations of holds, leases, the reconciler and the tally, and how
// they must relate to each other and to a call's longest life.
func (c *Config) checkHoldTimes(bad complain) {
	positive := map[string]time.Duration{
		"limits.upstream_timeout": c.Limits.UpstreamTimeout, "limits.header_timeout": c.Limits.HeaderTimeout,
		"limits.client_write_timeout": c.Limits.ClientWriteTimeout,
		"limits.settle_timeout":       c.Limits.SettleTimeout, "limits.admit_timeout": c.Limits.AdmitTimeout, "limits.shutdown_timeout": c.Limits.ShutdownTimeout,
		"holds.hold_ttl": c.Holds.HoldTTL, "holds.run_ttl": c.Holds.RunTTL, "holds.lease_ttl": c.Holds.LeaseTTL,
		"holds.heartbeat_interval": c.Holds.HeartbeatInterval, "holds.reconcile_interval": c.Holds.ReconcileInterval,
		"holds.reconcile_lock_ttl": c.Holds.ReconcileLockTTL, "holds.tally_ttl": c.Holds.TallyTTL,
	}
	for _, name := range sortedKeys(positive) {
		if positive[name] <= 0 {
			bad(name, "must be a positive duration such as 30s, got %v", positive[name])
		}
	}
	if 2*c.Holds.HeartbeatInterval > c.Holds.LeaseTTL {
		// With a beat just under the TTL, one beat lost to a Redis hiccup lapses the leases and
		// run reservations of every call the process serves while they still run.
		bad("holds.heartbeat_interval", "%v must be at most half of holds.lease_ttl %v, or one missed beat lapses the leases of calls still running", c.Holds.HeartbeatInterval, c.Holds.LeaseTTL)
	}
	if d, least := c.Holds.DeadInstanceAfter, c.Holds.leastDeadInstanceAfter(); d < 0 || (d > 0 && d < least) {
		bad("holds.dead_instance_after", "%v must be 0 (derived) or at least %v (lease_ttl plus two heartbeat intervals, and three intervals plus 5s): a dead process's leases must have lapsed", d, least)
	}
	if c.Holds.ReconcileLockTTL > 0 && c.Holds.ReconcileLockTTL < time.Millisecond {
		// Redis keeps it in milliseconds: SET ... PX 0 is an error, and no pass would ever run.
		bad("holds.reconcile_lock_ttl", "must be at least 1ms, got %v", c.Holds.ReconcileLockTTL)
	}
	if 2*c.Holds.HeartbeatInterval > min(c.Holds.HoldTTL, c.Holds.RunTTL) {
		bad("holds.heartbeat_interval", "%v must be at most half of hold_ttl and run_ttl: a lease is first written by a heartbeat", c.Holds.HeartbeatInterval)
	}
	// The tally is the reconciler's evidence: it must outlive every hold the reconciler may
	// still have to settle from it (an expired run waits up to a pass and a lock period), or
	// a run's tallied usage is lost and the run charged what it held.
	if need := max(c.Holds.HoldTTL, c.Holds.RunTTL) + c.Holds.ReconcileInterval + c.Holds.ReconcileLockTTL + time.Hour; c.Holds.TallyTTL < need {
		bad("holds.tally_ttl", "%v must be at least %v (the longer of hold_ttl and run_ttl, one reconcile pass and lock, and an hour): the reconciler settles from the tally", c.Holds.TallyTTL, need)
	}
	if call, reply := c.Limits.UpstreamTimeout+c.Limits.ClientWriteTimeout+time.Minute, c.dbReadTimeout(); c.Limits.AdmitTimeout+c.Limits.SettleTimeout+reply >= call {
		// A run settled on request is closed to new calls for the longest a call may live
		// (this sum); its settlement, retries included, must commit before that mark lapses, or
		// a call started after it would be left out of the charge. A settlement that shares its
		// batch with an admission waits for it up to admit_timeout, then up to settle_timeout
		// for its retry alone (holds.Writer), and a script of writes and COMMIT sent just before
		// that deadline is waited for past it, up to the driver's read timeout: its outcome
		// must be learnt, not abandoned.
		bad("limits.settle_timeout", "%v plus admit_timeout (%v) plus the database's read timeout (%v) must be shorter than upstream_timeout + client_write_timeout + 1m = %v",
			c.Limits.SettleTimeout, c.Limits.AdmitTimeout, reply, call)
	}
	if c.Holds.ReconcileBatch < 1 || c.Holds.ReconcileBatch > 10_000 {
		bad("holds.reconcile_batch", "must be in [1, 10000], got %d", c.Holds.ReconcileBatch)
	}
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

// Derived bounds on request bodies in memory (BodyMemoryBounds).
const (
	// DefaultMaxBodyMemory is the process's bound unless max_body_bytes asks for more room.
	DefaultMaxBodyMemory = 512 << 20
	// BodyMemoryShares is how many callers it takes, each holding its whole share, to fill
	// the process's bound: with a large share a few callers sending slow bodies (1 KiB/s, up
	// to an hour for 4 MiB) turned away every other caller's requests for as long.
	BodyMemoryShares = 16
)

// BodyMemoryBounds returns the bounds on request bodies held in memory: the process's and one
// caller's, as configured, or derived where 0 — the process's DefaultMaxBodyMemory or four
// largest bodies if more, a caller's a BodyMemoryShares-th of it or one largest body if more.
// Derived, they fit every max_body_bytes a configuration could have before they existed.
func (l Limits) BodyMemoryBounds() (total, perCaller int64) {
	total, perCaller = l.MaxBodyMemory, l.MaxBodyMemoryPerCaller
	if total == 0 {
		total = max(DefaultMaxBodyMemory, 4*l.MaxBodyBytes)
	}
	if perCaller == 0 {
		perCaller = min(total, max(l.MaxBodyBytes, total/BodyMemoryShares))
	}
	return total, perCaller
}

// checkSizes checks the bounds on request bodies, streamed events and whole answers.
func (c *Config) checkSizes(bad complain) {
	if c.Limits.MaxBodyBytes < 1024 || c.Limits.MaxBodyBytes > 1<<30 {
		bad("limits.max_body_bytes", "must be in [1KiB, 1GiB], got %d", c.Limits.MaxBodyBytes)
	}
	// Below one body's limit, a caller's largest request could never be read.
	total, perCaller := c.Limits.BodyMemoryBounds()
	if c.Limits.MaxBodyMemory != 0 && (total < c.Limits.MaxBodyBytes || total > 64<<30) {
		bad("limits.max_body_memory", "must be 0 (derived) or in [limits.max_body_bytes (%d), 64GiB], got %d", c.Limits.MaxBodyBytes, total)
	}
	if c.Limits.MaxBodyMemoryPerCaller != 0 && (perCaller < c.Limits.MaxBodyBytes || perCaller > total) {
		bad("limits.max_body_memory_per_caller", "must be 0 (derived) or in [limits.max_body_bytes (%d), limits.max_body_memory (%d)], got %d",
			c.Limits.MaxBodyBytes, total, perCaller)
	}
	if c.Limits.MaxEventBytes < 1024 || int64(c.Limits.MaxEventBytes) > 4<<30 {
		bad("limits.max_event_bytes", "must be in [1KiB, 4GiB], got %d", c.Limits.MaxEventBytes)
	} else if int64(c.Limits.MaxEventBytes) < 2*c.Limits.MaxBodyBytes {
		// The Responses API's last event repeats the request's instructions and input (escaped
		// again) with the whole output: one that passes the limit ends the stream before its
		// usage arrives, and a caller could make that happen with a large prompt. The limit
		// bounds an event, not a buffer: a stream's buffer grows only as large as its events.
		bad("limits.max_event_bytes", "must be at least twice limits.max_body_bytes (%d): a stream's last event may repeat the whole request, got %d",
			c.Limits.MaxBodyBytes, c.Limits.MaxEventBytes)
	}
	if c.Limits.MaxResponseBytes < 1024 || c.Limits.MaxResponseBytes > 1<<30 {
		// A whole answer is read before it is relayed: this much memory per call in flight.
		bad("limits.max_response_bytes", "must be in [1KiB, 1GiB], got %d", c.Limits.MaxResponseBytes)
	}
}

// checkDedup checks the duplicate window and the Idempotency-Key answers' store.
func (c *Config) checkDedup(bad complain) {
	if c.Dedup.Window < 0 || (c.Dedup.Window > 0 && c.Dedup.Window < time.Millisecond) {
		// Redis keeps it in milliseconds: under one, the fingerprint's SET ... PX 0 is an error
		// and every plain request 503 dedup_unavailable.
		bad("dedup.window", "must be 0 (off) or at least 1ms, got %v", c.Dedup.Window)
	}
	if c.Dedup.ReplayTTL < time.Second {
		// Redis keeps it in milliseconds: under one it is PEXPIRE 0, a record deleted at once.
		bad("dedup.replay_ttl", "must be at least 1s, got %v: an Idempotency-Key record that expires at once is answered 409 forever", c.Dedup.ReplayTTL)
	}
	if c.Dedup.MaxReplayLen <= 0 || c.Dedup.MaxReplayLen > 64<<20 {
		// Each idempotent answer is kept in memory while it is relayed and in Redis for replay_ttl.
		bad("dedup.max_replay_len", "must be in [1, 64MiB], got %d", c.Dedup.MaxReplayLen)
	}
}

// checkTimeouts checks the key cache and the admission and settlement deadlines' floor.
func (c *Config) checkTimeouts(bad complain) {
	if c.Limits.KeyCacheTTL < 0 {
		bad("limits.key_cache_ttl", "must not be negative (0 turns the cache off), got %v", c.Limits.KeyCacheTTL)
	} else if c.Limits.KeyCacheTTL > time.Minute {
		bad("limits.key_cache_ttl", "must be at most 1m, got %v: a revoked key works for as long as it is cached", c.Limits.KeyCacheTTL)
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"limits.admit_timeout", c.Limits.AdmitTimeout}, {"limits.settle_timeout", c.Limits.SettleTimeout}} {
		if t.d > 0 && t.d < 100*time.Millisecond {
			bad(t.name, "must be at least 100ms, got %v: one transaction takes milliseconds", t.d)
		}
	}
}

// checkPlans checks every plan's amounts and limits.
func (c *Config) checkPlans(bad complain) {
	if len(c.Plans) == 0 {
		bad("plans", "no plan configured")
	} else if _, ok := c.Plans[c.DefaultPlan]; !ok {
		bad("default_plan", "%q is no configured plan (configured: %v): users created without a plan get it, and users whose plan is no longer configured its terms",
			c.DefaultPlan, sortedKeys(c.Plans))
	}
	for _, name := range sortedKeys(c.Plans) {
		p := c.Plans[name]
		if p.AllowanceCredits.Milli < 0 {
			bad("plans."+name+".allowance_credits", "must not be negative")
		}
		// Credits become micro-USD at credit_micro; past int64 the product wraps, and a wrapped
		// cap or hold is a wrong (even negative) amount of money. A trillion credits is what the
		// admin API accepts too.
		for _, a := range []struct {
			field string
			c     Credits
		}{{"allowance_credits", p.AllowanceCredits}, {"hold_normal_credits", p.HoldNormalCredits},
			{"hold_heavy_credits", p.HoldHeavyCredits}, {"max_run_cost_credits", p.MaxRunCostCredits}} {
			if a.c.Milli > maxPlanMilli || (c.CreditMicro > 0 && a.c.Milli > maxPlanMilli*1000/c.CreditMicro) {
				bad("plans."+name+"."+a.field, "is too large: at most 10^12 credits and 10^15 micro-USD (credit_micro %d)", c.CreditMicro)
			}
		}
		if p.HoldNormalCredits.Milli <= 0 || p.HoldHeavyCredits.Milli < p.HoldNormalCredits.Milli {
			bad("plans."+name+".hold_*_credits", "need 0 < hold_normal_credits <= hold_heavy_credits")
		}
		if p.MaxRunCostCredits.Milli < p.HoldHeavyCredits.Milli {
			bad("plans."+name+".max_run_cost_credits", "must be at least hold_heavy_credits")
		}
		if p.MaxInFlight < 1 || p.MaxInFlight > 10_000 {
			bad("plans."+name+".max_in_flight", "must be in [1, 10000], got %d", p.MaxInFlight)
		}
		if p.HeavyAfterTurns < 1 {
			bad("plans."+name+".heavy_after_turns", "must be at least 1")
		}
		if p.DiscountBP < 0 || p.DiscountBP > 10_000 {
			bad("plans."+name+".discount_bp", "must be in [0, 10000], got %d", p.DiscountBP)
		}
	}
}

// checkModels checks the price list and returns it as a table (nil when it cannot be built).
func (c *Config) checkModels(bad complain) *pricing.Table {
	if len(c.Models) == 0 {
		bad("models", "no model priced: every request would be refused")
	}
	for name, m := range c.Models {
		if strings.Contains(name, "*") {
			// Prices match a model by name, then by the longest name here that prefixes it.
			bad("models."+name, "a price's name holds no *: %q prices only models whose names start with it literally; a name prices every model it prefixes (write %q)",
				name, strings.TrimRight(name, "*"))
		}
		if m.MaxOutputTokens < 0 {
			bad("models."+name+".max_output_tokens", "must not be negative (0 or left out: unknown), got %d", m.MaxOutputTokens)
		}
		switch m.OutputBoundField {
		case "", "max_tokens", "max_completion_tokens":
		default:
			bad("models."+name+".output_bound_field", "must be max_tokens or max_completion_tokens, got %q", m.OutputBoundField)
		}
	}
	prices, err := c.PriceTable()
	if err != nil {
		bad("models", "%v", err)
	}
	return prices
}

// checkUpstreams checks every upstream: its name, kind, base URL, models (against prices, when
// the price list could be read) and key.
func (c *Config) checkUpstreams(bad complain, prices *pricing.Table) {
	if len(c.Upstreams) == 0 {
		bad("upstreams", "no upstream configured")
	}
	seen := map[string]bool{}
	for i, u := range c.Upstreams {
		at := fmt.Sprintf("upstreams[%d]", i)
		if u.Name == "" || seen[u.Name] {
			bad(at+".name", "must be set and unique, got %q", u.Name)
		}
		seen[u.Name] = true
		if u.Kind != "openai" && u.Kind != "anthropic" {
			bad(at+".kind", "must be openai or anthropic, got %q", u.Kind)
		}
		if pu, err := url.Parse(u.BaseURL); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			bad(at+".base_url", "%q is not an http(s) URL", shownURL(u.BaseURL))
		} else {
			// Every call goes to base_url + "/v1/...", the caller's query appended: what is
			// not an origin and a path prefix makes every call's URL wrong.
			switch {
			case pu.User != nil:
				bad(at+".base_url", "%q holds credentials: give the key in api_key_env (or UPSTREAM_API_KEY)", shownURL(u.BaseURL))
			case pu.RawQuery != "" || pu.ForceQuery:
				bad(at+".base_url", "%q has a query: calls go to base_url + /v1/..., so it would end up inside their path", shownURL(u.BaseURL))
			case pu.Fragment != "":
				bad(at+".base_url", "%q has a fragment: calls go to base_url + /v1/...", shownURL(u.BaseURL))
			case strings.HasSuffix(strings.TrimSuffix(pu.Path, "/"), "/v1"):
				bad(at+".base_url", "%q ends in /v1: the gateway adds /v1/... itself, so calls would go to /v1/v1/...; give the origin (https://api.openai.com)", shownURL(u.BaseURL))
			}
		}
		if len(u.Models) == 0 {
			bad(at+".models", "lists no model; use [\"*\"] to serve every priced model")
		}
		for _, m := range u.Models {
			switch {
			case m == "*":
			case m == "" || strings.Contains(strings.TrimSuffix(m, "*"), "*"):
				bad(at+".models", "%q is neither a model name, a prefix ending in * nor *", m)
			case prices != nil && !c.servesPriced(prices, m):
				// Unpriced models are refused: the entry can serve nothing (a typo?).
				bad(at+".models", "%q matches no model priced in models, so it serves nothing: unpriced models are refused", m)
			}
		}
		if u.APIKeyEnv != "" && !envName(u.APIKeyEnv) {
			// Not printed: what is written here instead of a variable's name is most often
			// the key itself.
			bad(at+".api_key_env", "is not an environment variable name (letters, digits and _, not starting with a digit): "+
				"it names the variable that holds the key, never the key itself")
		} else if u.APIKeyEnv != "" && u.APIKey == "" && conventionalEnvName(u.APIKeyEnv) {
			bad(at+".api_key_env", "environment variable %s is empty", u.APIKeyEnv)
		} else if u.APIKeyEnv != "" && u.APIKey == "" {
			// A key of letters, digits and _ alone (gsk_..., a provider's 32 letters and
			// digits) is a valid name too: one in lower case is not printed.
			bad(at+".api_key_env", "the environment variable it names is empty (its name, which has lower case letters, "+
				"is not printed: it may be the key itself written in place of the variable's name)")
		}
		if !sendableSecret(u.APIKey) {
			bad(at+" API key (UPSTREAM_API_KEY or api_key_env)", "has white space at either end or a control character (a newline kept from a secret file?): "+
				"it could not be sent in a header, and every call to this upstream would fail")
		}
	}
}

// servesPriced reports whether upstream entry m (a name or "prefix*") can match a priced
// model: a name priced exactly or by a prefix, or a prefix that some priced name starts with
// or that starts with one.
func (c *Config) servesPriced(prices *pricing.Table, m string) bool {
	prefix, isPrefix := strings.CutSuffix(m, "*")
	if !isPrefix {
		_, _, err := prices.Lookup(m)
		return err == nil
	}
	for name := range c.Models {
		if strings.HasPrefix(name, prefix) || strings.HasPrefix(prefix, name) {
			return true
		}
	}
	return false
}

// PriceTable builds the pricing table from the models section.
func (c *Config) PriceTable() (*pricing.Table, error) {
	prices := make(map[string]pricing.Price, len(c.Models))
	for name, m := range c.Models {
		prices[name] = pricing.Price{Input: m.Input.Micro, CacheRead: m.CacheRead.Micro, CacheWrite: m.CacheWrite.Micro,
			CacheWrite1h: m.CacheWrite1h.Micro, AudioInput: m.AudioInput.Micro,
			AudioOutput: m.AudioOutput.Micro, Output: m.Output.Micro}
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
			return len(m) > 1 && strings.HasSuffix(m, "*") && strings.HasPrefix(model, strings.TrimSuffix(m, "*"))
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

// envName reports whether s is a portable environment variable name: [A-Za-z_][A-Za-z0-9_]*.
func envName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

// redisURLAtPastHost reports an '@' past a REDIS_URL's host, where none belongs: a password
// holding '/', '?' or '#' ends the host part early, and the rest of it lands in the path or
// query, which go-redis's own errors quote ("invalid URL path: /pw@host", "unexpected option:
// pw"). The one place an '@' is a value is client_name, a free-form name go-redis sends as is
// (tollgate@prod-1); any other option's value is a number, a duration or a boolean.
func redisURLAtPastHost(u *url.URL) bool {
	if strings.Contains(u.Path, "@") || strings.Contains(u.Fragment, "@") {
		return true
	}
	for _, pair := range strings.Split(u.RawQuery, "&") {
		name, value, _ := strings.Cut(pair, "=")
		if strings.Contains(name, "@") || (strings.Contains(value, "@") && name != "client_name") {
			return true
		}
	}
	return false
}

// conventionalEnvName reports whether an envName is written as variables are (OPENAI_API_KEY:
// no lower case letters), and so safe to print: keys mix cases.
func conventionalEnvName(s string) bool { return strings.ToUpper(s) == s }

// sendableSecret reports whether a token or key can travel as is in an HTTP header and be
// matched there: no white space at either end (callers' credentials are trimmed, and a
// provider trims or refuses) and no control character (Go refuses such a header value, and
// a newline in it would split the header). The empty string passes: it means "not set".
func sendableSecret(s string) bool {
	if strings.TrimSpace(s) != s {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// shownURL is a base_url fit for an error message: redactURL's, less its query and fragment,
// which may hold a key too (?key=... is how some providers take it).
func shownURL(raw string) string {
	s := redactURL(raw)
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i+1] + "xxxxx"
	}
	return s
}

// redactURL is a URL fit for an error message: everything between its scheme's "://" (or
// its start) and its last '@' — the user info, which may hold the Redis password or an
// upstream's credentials — is replaced by "xxxxx". url.URL.Redacted is not enough: it keeps a
// user name (a token given as one) and leaves alone a URL it reads as opaque or relative
// ("default:pw@host:6379" without its scheme, "redis//:pw@host").
func redactURL(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	start := 0
	if i := strings.Index(raw[:at], "://"); i >= 0 {
		start = i + len("://")
	}
	return raw[:start] + "xxxxx" + raw[at:]
}
