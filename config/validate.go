package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/pricing"
)

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
	c.checkDurationCeiling(bad)
	c.checkHoldTimes(bad)
	c.checkSizes(bad)
	c.checkDedup(bad)
	c.checkTimeouts(bad)
	c.checkPlans(bad)
	prices := c.checkModels(bad)
	c.checkUpstreams(bad, prices, needRedis)
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

// maxInstanceNameLen is the longest instance name the database records (VARCHAR(255)).
const maxInstanceNameLen = 255

// maxRedisKeyPrefixLen bounds redis_key_prefix: a namespace a few bytes long is all it is for,
// and every key of every call carries it (a tally is about 300 bytes: a prefix pasted from a
// file multiplied what Redis holds, and past 64 KiB its record, redis_prefix.prefix, a BLOB,
// could not hold it whole).
const maxRedisKeyPrefixLen = 255

// checkService checks where the gateway listens, what it connects to and its money unit.
func (c *Config) checkService(bad complain, needRedis bool) {
	if c.ListenAddr == "" {
		bad("listen_addr (LISTEN_ADDR)", "is empty")
	} else if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		bad("listen_addr (LISTEN_ADDR)", "%q is not host:port (127.0.0.1:8080, or :8080 for every interface)", c.ListenAddr)
	}
	if c.MySQLDSN == "" {
		bad("mysql_dsn (MYSQL_DSN)", "is empty; e.g. tollgate:tollgate@tcp(127.0.0.1:3306)/tollgate")
	} else if dsn, err := mysql.ParseDSN(c.MySQLDSN); err == nil {
		// The driver applies a timeout only above 0, and the gateway puts its own in place of 0
		// alone: a negative one was no bound at all, where the checks below count the read
		// timeout as bounding a stalled COMMIT.
		for _, t := range []struct {
			name string
			d    time.Duration
		}{{"readTimeout", dsn.ReadTimeout}, {"writeTimeout", dsn.WriteTimeout}, {"timeout", dsn.Timeout}} {
			if t.d < 0 {
				bad("mysql_dsn (MYSQL_DSN)", "%s %v is negative: the driver would then wait for the database without bound (leave it out for the gateway's)", t.name, t.d)
			}
		}
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
	} else if c.RedisCluster && strings.Trim(u.Path, "/") != "" && strings.Trim(u.Path, "/") != "0" {
		bad("redis_url (REDIS_URL)", "%q names database %s: a Redis Cluster (redis_cluster) has database 0 only", redactURL(c.RedisURL),
			strings.Trim(u.Path, "/"))
	} else if !c.RedisCluster && u.Query().Has("addr") {
		bad("redis_url (REDIS_URL)", "%q names more nodes (addr=): set redis_cluster: true (REDIS_CLUSTER=true) for a Redis Cluster", redactURL(c.RedisURL))
	}
	if c.badRedisClusterEnv != "" {
		bad("redis_cluster (REDIS_CLUSTER)", "%q is neither true nor false", c.badRedisClusterEnv)
	}
	if len(c.RedisKeyPrefix) > maxRedisKeyPrefixLen {
		bad("redis_key_prefix (TOLLGATE_REDIS_PREFIX)", "is %d bytes, at most %d: every key of every call carries it", len(c.RedisKeyPrefix), maxRedisKeyPrefixLen)
	}
	if c.RedisCluster && strings.ContainsAny(c.RedisKeyPrefix, "{}") {
		bad("redis_key_prefix (TOLLGATE_REDIS_PREFIX)", "%q holds a brace: on a Redis Cluster (redis_cluster) the keys' own braces "+
			"are their hash tags, which keep the keys of a run in one slot", c.RedisKeyPrefix)
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		bad("admin_token (ADMIN_TOKEN)", "is shorter than 16 bytes")
	}
	if !sendableSecret(c.AdminToken) {
		bad("admin_token (ADMIN_TOKEN)", "has white space at either end or a control character (a newline kept from a secret file?): "+
			"the admin API trims the token a caller sends, so this one could never be matched")
	}
	if !utf8.ValidString(c.Instance) {
		// Recorded in utf8mb4 columns: bytes that are not UTF-8 failed the start at its first
		// record with "Incorrect string value" for credit_unit.set_by, naming no setting.
		bad("instance (TOLLGATE_INSTANCE)", "%q is not UTF-8 text: the database records it (instances.name)", c.Instance)
	} else if utf8.RuneCountInString(c.Instance) > maxInstanceNameLen {
		// Recorded in instances.name and the set_by of credit_unit and plan_terms: a longer
		// name failed the start at its first record, naming a column instead of this setting.
		bad("instance (TOLLGATE_INSTANCE)", "is %d characters, at most %d: the database records it (instances.name)",
			utf8.RuneCountInString(c.Instance), maxInstanceNameLen)
	}
	if c.CreditMicro <= 0 {
		bad("credit_micro", "must be positive, got %d", c.CreditMicro)
	} else if !pricing.ExactCreditMicro(c.CreditMicro) {
		// 1 micro-USD would be 1/credit_micro credits, which no decimal shows exactly: reports
		// and balances would drift from the ledger.
		bad("credit_micro", "must be a product of 2s and 5s (1000, 10000, 5000000, ...) so that credits are exact decimals, got %d", c.CreditMicro)
	}
}

// maxDuration bounds every duration setting. Ten years is past any timeout or TTL an operator
// means, and keeps the sums the checks below make (up to four durations and an hour) far from
// time.Duration's end, about 292 years: past it a sum wrapped negative, and a check passed that
// should have failed — a hold_ttl of 292 years with a reconcile_interval of 100h needed a
// negative tally_ttl, so the default 48h passed for a tally that lapses long before its hold.
const maxDuration = 10 * 365 * 24 * time.Hour

// checkDurationCeiling refuses a duration setting past maxDuration (key_cache_ttl has a bound
// of its own, checkTimeouts).
func (c *Config) checkDurationCeiling(bad complain) {
	all := map[string]time.Duration{
		"limits.upstream_timeout": c.Limits.UpstreamTimeout, "limits.header_timeout": c.Limits.HeaderTimeout,
		"limits.client_write_timeout": c.Limits.ClientWriteTimeout, "limits.admit_timeout": c.Limits.AdmitTimeout,
		"limits.settle_timeout": c.Limits.SettleTimeout, "limits.shutdown_timeout": c.Limits.ShutdownTimeout,
		"holds.hold_ttl": c.Holds.HoldTTL, "holds.run_ttl": c.Holds.RunTTL, "holds.lease_ttl": c.Holds.LeaseTTL,
		"holds.heartbeat_interval": c.Holds.HeartbeatInterval, "holds.reconcile_interval": c.Holds.ReconcileInterval,
		"holds.reconcile_lock_ttl": c.Holds.ReconcileLockTTL, "holds.tally_ttl": c.Holds.TallyTTL,
		"holds.dead_instance_after": c.Holds.DeadInstanceAfter, "dedup.window": c.Dedup.Window, "dedup.replay_ttl": c.Dedup.ReplayTTL,
	}
	for _, name := range sortedKeys(all) {
		if all[name] > maxDuration {
			bad(name, "must be at most %v (ten years), got %v", maxDuration, all[name])
		}
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
	if c.Holds.LeaseTTL > 0 && c.Holds.LeaseTTL < time.Millisecond {
		// Redis keeps it in milliseconds, for the leases and as the age past which a named run's
		// reservation without a beat is dropped: at 0 every lease's SET ... PX 0 failed, so no
		// lease was ever written (another process's reconciler took a call that outlived its
		// hold for an orphan), and a reservation not beaten within its millisecond was dropped.
		bad("holds.lease_ttl", "must be at least 1ms, got %v: Redis keeps it in milliseconds", c.Holds.LeaseTTL)
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
		// batch with an admission waits for it up to admit_timeout (the earliest deadline of
		// the batch's admissions, each at most admit_timeout away), then up to settle_timeout
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
	// Below one answer's limit, the largest answer could never be read.
	if n := c.Limits.MaxResponseMemory; n != 0 && (n < c.Limits.MaxResponseBytes || n > 64<<30) {
		bad("limits.max_response_memory", "must be 0 (derived) or in [limits.max_response_bytes (%d), 64GiB], got %d", c.Limits.MaxResponseBytes, n)
	}
	// Below one answer's limit, a caller's largest answer could never be held.
	if n, total := c.Limits.MaxResponseMemoryPerCaller, c.Limits.ResponseMemoryBound(); n != 0 && (n < c.Limits.MaxResponseBytes || n > total) {
		bad("limits.max_response_memory_per_caller", "must be 0 (derived) or in [limits.max_response_bytes (%d), limits.max_response_memory (%d)], got %d",
			c.Limits.MaxResponseBytes, total, n)
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
	// At least one answer of max_replay_len with its record must fit, or none ever would.
	if n := c.Dedup.MaxReplayBytesPerCaller; n != 0 && (n < c.Dedup.MaxReplayLen+ReplayRecordOverhead || n > 64<<30) {
		bad("dedup.max_replay_bytes_per_caller", "must be 0 (derived) or in [dedup.max_replay_len + 1 KiB (%d), 64GiB], got %d", c.Dedup.MaxReplayLen+ReplayRecordOverhead, n)
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

// maxPlanMilli bounds a plan amount: 10^12 credits in thousandths, and (scaled by
// credit_micro) 10^15 micro-USD, so that sums of allowances, prepaid credits and holds stay far
// inside int64.
const maxPlanMilli = 1_000_000_000_000_000

// maxPlanNameLen is the longest plan name a user's row holds (users.plan, VARCHAR(32)).
const maxPlanNameLen = 32

// checkPlans checks every plan's name, amounts and limits.
func (c *Config) checkPlans(bad complain) {
	if len(c.Plans) == 0 {
		bad("plans", "no plan configured")
	} else if _, ok := c.Plans[c.DefaultPlan]; !ok {
		bad("default_plan", "%q is no configured plan (configured: %v): users created without a plan get it, and users whose plan is no longer configured its terms",
			c.DefaultPlan, sortedKeys(c.Plans))
	}
	for _, name := range sortedKeys(c.Plans) {
		p := c.Plans[name]
		if n := utf8.RuneCountInString(name); n == 0 || n > maxPlanNameLen {
			bad("plans."+name, "a plan's name is 1-%d characters (users.plan holds it): a longer one cannot be stored, and on a server without strict mode it was cut to one that names no plan, its users served on default_plan's terms", maxPlanNameLen)
		}
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
	lineBad := false
	for _, name := range sortedKeys(c.Models) { // the same start refused in the same words each time
		m := c.Models[name]
		if l := m.LongContext; l != (LongContextCfg{}) && (l.AbovePromptTokens <= 0 || l.AbovePromptTokens > pricing.MaxTokens) {
			// Named here by its path, where told can drop it (a line left out is already
			// named missing); the table's own check below would name it under "models" again.
			lineBad = true
			bad("models."+name+".long_context.above_prompt_tokens", "long-context line %d prompt tokens outside [1, %d]", l.AbovePromptTokens, int64(pricing.MaxTokens))
		}
		if strings.Contains(name, "*") {
			// Prices match a model by name, then by the longest name here that prefixes it.
			bad("models."+name, "a price's name holds no *: %q prices only models whose names start with it literally; a name prices every model it prefixes (write %q)",
				name, strings.TrimRight(name, "*"))
		}
		if len(name) > MaxModelNameLen {
			bad("models."+name, "a price's name is at most %d bytes: a call naming a longer model is refused (model_too_long), so the price would bill no call",
				MaxModelNameLen)
		}
		if strings.Contains(name, ",") {
			// A call naming it is refused as a router's fallback chain (Helicone's "cheap,dear"):
			// the price would be listed in /v1/models and bill nothing.
			bad("models."+name, "a price's name holds no ',': a model named %q is refused as a router's fallback chain, so the price would bill no call", name)
		}
		if m.MaxOutputTokens < 0 {
			bad("models."+name+".max_output_tokens", "must not be negative (0 or left out: unknown), got %d", m.MaxOutputTokens)
		}
		switch m.OutputBoundField {
		case "", "max_tokens", "max_completion_tokens":
		default:
			bad("models."+name+".output_bound_field", "must be max_tokens or max_completion_tokens, got %q", m.OutputBoundField)
		}
		checkLongParts(bad, name, m)
	}
	if lineBad {
		return nil // the table refuses the same line; upstreams are checked without prices
	}
	prices, err := c.PriceTable()
	if err != nil {
		bad("models", "%v", err)
	}
	return prices
}

// checkLongParts refuses a long_context that leaves out a part price (one-hour cache writes,
// audio in or out) its model prices. The model's price is what lets such a request through
// (unpricedOption refuses it without one); left out of the block, a long call's part was
// billed at the block's whole price (cache_write, input, output), below what the provider
// bills past its line, and often below the short part price itself.
func checkLongParts(bad complain, name string, m ModelCfg) {
	l := m.LongContext
	if l == (LongContextCfg{}) {
		return
	}
	for _, part := range []struct {
		key, whole  string
		short, long int64
	}{
		{"cache_write_1h", "cache_write", m.CacheWrite1h.Micro, l.CacheWrite1h.Micro},
		{"audio_input", "input", m.AudioInput.Micro, l.AudioInput.Micro},
		{"audio_output", "output", m.AudioOutput.Micro, l.AudioOutput.Micro},
	} {
		if part.short > 0 && part.long == 0 {
			bad("models."+name+".long_context."+part.key, "must be priced, as the model's own %s is: left out, the %s tokens of a call "+
				"past the line would be billed at the block's %s price, below the provider's long-context rate", part.key, part.key, part.whole)
		}
	}
}

// checkUpstreams checks every upstream: its name, kind, base URL, models (against prices, when
// the price list could be read) and key. needKeys false (LoadWithoutRedis: the commands that use
// the database alone, which never call an upstream) lets a key be unset: the fleet's config
// names api_key_env variables that an operator's host need not hold to disable a user or grant
// credits.
func (c *Config) checkUpstreams(bad complain, prices *pricing.Table, needKeys bool) {
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
		checkBaseURL(bad, at, u.BaseURL)
		c.checkUpstreamModels(bad, at, u.Models, prices)
		c.checkShadowedModels(bad, i)
		checkUpstreamKey(bad, at, u, needKeys)
	}
}

// MaxModelNameLen is the longest model name a hold records (run_holds.model, VARCHAR(128);
// holds.MaxModelLen, which a test there keeps equal): a call naming a longer one is refused
// (model_too_long), so a price or an upstream entry whose name is longer serves no call.
const MaxModelNameLen = 128

// checkShadowedModels refuses an entry of upstream i's models that an earlier upstream's
// entry takes every request of (UpstreamFor: the first upstream by exact name, then the first
// by prefix, then the first "*"): the same entry, or a prefix inside an earlier one's shorter
// prefix ("gpt-4o*" below "gpt-*"). It would serve nothing — a fallback that never runs, or an
// entry moved to a new provider while the old one still lists it above.
func (c *Config) checkShadowedModels(bad complain, i int) {
	for _, m := range c.Upstreams[i].Models {
		for k := range i {
			for _, earlier := range c.Upstreams[k].Models {
				if m == earlier || (isModelPrefix(m) && isModelPrefix(earlier) &&
					strings.HasPrefix(strings.TrimSuffix(m, "*"), strings.TrimSuffix(earlier, "*"))) {
					bad(fmt.Sprintf("upstreams[%d].models", i), "%q is taken by %q of upstreams[%d] (%s) before it: every request for it goes there, so here it serves nothing (list it in an upstream before that one)",
						m, earlier, k, c.Upstreams[k].Name)
				}
			}
		}
	}
}

// isModelPrefix reports whether a models entry is a "prefix*" (not "*", not an exact name).
func isModelPrefix(m string) bool { return len(m) > 1 && strings.HasSuffix(m, "*") }

// checkBaseURL checks upstream at's base URL. Every call goes to base_url + "/v1/...", the
// caller's query appended: what is not an origin and a path prefix makes every call's URL
// wrong.
func checkBaseURL(bad complain, at, baseURL string) {
	pu, err := url.Parse(baseURL)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		bad(at+".base_url", "%q is not an http(s) URL", shownURL(baseURL))
		return
	}
	switch {
	case pu.User != nil:
		bad(at+".base_url", "%q holds credentials: give the key in api_key_env (or UPSTREAM_API_KEY)", shownURL(baseURL))
	case pu.RawQuery != "" || pu.ForceQuery:
		bad(at+".base_url", "%q has a query: calls go to base_url + /v1/..., so it would end up inside their path", shownURL(baseURL))
	case pu.Fragment != "":
		bad(at+".base_url", "%q has a fragment: calls go to base_url + /v1/...", shownURL(baseURL))
	case pu.Port() != "" && !validPort(pu.Port()):
		// url.Parse takes any digits as a port: every call's dial would fail.
		bad(at+".base_url", "%q has port %s, outside 1-65535", shownURL(baseURL), pu.Port())
	case strings.HasSuffix(strings.TrimSuffix(pu.Path, "/"), "/v1"):
		bad(at+".base_url", "%q ends in /v1: the gateway adds /v1/... itself, so calls would go to /v1/v1/...; give the origin (https://api.openai.com)", shownURL(baseURL))
	}
}

// validPort reports whether port, digits as url.Parse leaves them, is a TCP port to dial.
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

// checkUpstreamModels checks the models upstream at serves, against prices when the price
// list could be read (nil: it could not).
func (c *Config) checkUpstreamModels(bad complain, at string, models []string, prices *pricing.Table) {
	if len(models) == 0 {
		bad(at+".models", "lists no model; use [\"*\"] to serve every priced model")
	}
	for _, m := range models {
		switch {
		case m == "*":
		case m == "" || strings.Contains(strings.TrimSuffix(m, "*"), "*"):
			bad(at+".models", "%q is neither a model name, a prefix ending in * nor *", m)
		case len(strings.TrimSuffix(m, "*")) > MaxModelNameLen:
			bad(at+".models", "%q is longer than a model name may be (%d bytes): a call naming such a model is refused (model_too_long), so it serves nothing",
				m, MaxModelNameLen)
		case prices != nil && !c.servesPriced(prices, m):
			// Unpriced models are refused: the entry can serve nothing (a typo?).
			bad(at+".models", "%q matches no model priced in models, so it serves nothing: unpriced models are refused", m)
		}
	}
}

// checkUpstreamKey checks upstream at's key: the variable api_key_env names, and that the key
// can be sent in a header. A bad key fails every call to the upstream, so it stops the start.
func checkUpstreamKey(bad complain, at string, u Upstream, needKey bool) {
	if u.APIKeyEnv != "" && !envName(u.APIKeyEnv) {
		// Not printed: what is written here instead of a variable's name is most often
		// the key itself.
		bad(at+".api_key_env", "is not an environment variable name (letters, digits and _, not starting with a digit): "+
			"it names the variable that holds the key, never the key itself")
	} else if needKey && u.APIKeyEnv != "" && u.APIKey == "" && conventionalEnvName(u.APIKeyEnv) {
		bad(at+".api_key_env", "environment variable %s is empty", u.APIKeyEnv)
	} else if needKey && u.APIKeyEnv != "" && u.APIKey == "" {
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
