package config

import (
	"strings"
	"testing"
	"time"
)

// TestMoneyBoundsAreCheckedAtTheirEdges: every bound that protects money or access is refused
// one step past its edge and accepted at it, so a flipped comparison or a term dropped from a
// sum is caught. A mutation review found these edges unchecked: admin_token's 16 bytes, a zero
// duration, heartbeat_interval against hold_ttl, tally_ttl's hour and lock period,
// settle_timeout's admit_timeout term and its equality, the 100ms floors, reconcile_batch,
// key_cache_ttl below zero, the plan's hold order, max_in_flight, heavy_after_turns,
// discount_bp, max_output_tokens and replay_ttl.
func TestMoneyBoundsAreCheckedAtTheirEdges(t *testing.T) {
	plan := func(set func(p *Plan)) func(c *Config) {
		return func(c *Config) {
			p := c.Plans["standard"]
			set(&p)
			c.Plans["standard"] = p
		}
	}
	// Defaults: hold_ttl = run_ttl 900s, reconcile_interval 60s, reconcile_lock_ttl 50s, so
	// tally_ttl needs 900s + 60s + 50s + 1h. upstream_timeout 300s + client_write_timeout 60s
	// + 1m = 420s is a call's longest life; admit_timeout 5s and the default read timeout 30s
	// leave settle_timeout under 385s.
	tallyNeed := 900*time.Second + 60*time.Second + 50*time.Second + time.Hour
	for _, tc := range []struct {
		name string
		set  func(c *Config)
		want string // the setting named in the refusal; "" when it must be accepted
	}{
		{"admin token of 15 bytes", func(c *Config) { c.AdminToken = strings.Repeat("a", 15) }, "admin_token (ADMIN_TOKEN)"},
		{"admin token of 16 bytes", func(c *Config) { c.AdminToken = strings.Repeat("a", 16) }, ""},
		{"zero shutdown_timeout", func(c *Config) { c.Limits.ShutdownTimeout = 0 }, "limits.shutdown_timeout"},
		{"zero reconcile_interval", func(c *Config) { c.Holds.ReconcileInterval = 0 }, "holds.reconcile_interval"},
		{"heartbeat over half of hold_ttl", func(c *Config) { c.Holds.HoldTTL = 19 * time.Second; c.Holds.TallyTTL = 2 * time.Hour }, "holds.heartbeat_interval"},
		{"heartbeat at half of hold_ttl", func(c *Config) { c.Holds.HoldTTL = 20 * time.Second; c.Holds.RunTTL = 20 * time.Second }, ""},
		{"tally_ttl a second short", func(c *Config) { c.Holds.TallyTTL = tallyNeed - time.Second }, "holds.tally_ttl"},
		{"tally_ttl just enough", func(c *Config) { c.Holds.TallyTTL = tallyNeed }, ""},
		{"settle_timeout at the call's life", func(c *Config) { c.Limits.SettleTimeout = 385 * time.Second }, "limits.settle_timeout"},
		{"settle_timeout just under it", func(c *Config) { c.Limits.SettleTimeout = 384 * time.Second }, ""},
		{"settle_timeout 99ms", func(c *Config) { c.Limits.SettleTimeout = 99 * time.Millisecond }, "limits.settle_timeout"},
		{"admit_timeout 99ms", func(c *Config) { c.Limits.AdmitTimeout = 99 * time.Millisecond }, "limits.admit_timeout"},
		{"settle and admit timeouts 100ms", func(c *Config) {
			c.Limits.SettleTimeout, c.Limits.AdmitTimeout = 100*time.Millisecond, 100*time.Millisecond
		}, ""},
		{"reconcile_batch 0", func(c *Config) { c.Holds.ReconcileBatch = 0 }, "holds.reconcile_batch"},
		{"reconcile_batch 1", func(c *Config) { c.Holds.ReconcileBatch = 1 }, ""},
		{"reconcile_batch 10001", func(c *Config) { c.Holds.ReconcileBatch = 10_001 }, "holds.reconcile_batch"},
		{"key_cache_ttl -1ns", func(c *Config) { c.Limits.KeyCacheTTL = -1 }, "limits.key_cache_ttl"},
		{"key_cache_ttl 0 (off)", func(c *Config) { c.Limits.KeyCacheTTL = 0 }, ""},
		{"key_cache_ttl 1m", func(c *Config) { c.Limits.KeyCacheTTL = time.Minute }, ""},
		{"key_cache_ttl 1m1ns", func(c *Config) { c.Limits.KeyCacheTTL = time.Minute + 1 }, "limits.key_cache_ttl"},
		{"replay_ttl 999ms", func(c *Config) { c.Dedup.ReplayTTL = 999 * time.Millisecond }, "dedup.replay_ttl"},
		{"replay_ttl 1s", func(c *Config) { c.Dedup.ReplayTTL = time.Second }, ""},
		{"hold_normal 0", plan(func(p *Plan) { p.HoldNormalCredits = Credits{} }), "plans.standard.hold_*_credits"},
		{"hold_heavy under hold_normal", plan(func(p *Plan) { p.HoldHeavyCredits = Credits{Milli: p.HoldNormalCredits.Milli - 1} }), "plans.standard.hold_*_credits"},
		{"hold_heavy = hold_normal", plan(func(p *Plan) { p.HoldHeavyCredits = p.HoldNormalCredits }), ""},
		{"max_run_cost under hold_heavy", plan(func(p *Plan) { p.MaxRunCostCredits = Credits{Milli: p.HoldHeavyCredits.Milli - 1} }), "plans.standard.max_run_cost_credits"},
		{"max_run_cost = hold_heavy", plan(func(p *Plan) { p.MaxRunCostCredits = p.HoldHeavyCredits }), ""},
		{"max_in_flight 0", plan(func(p *Plan) { p.MaxInFlight = 0 }), "plans.standard.max_in_flight"},
		{"max_in_flight 1", plan(func(p *Plan) { p.MaxInFlight = 1 }), ""},
		{"max_in_flight 10000", plan(func(p *Plan) { p.MaxInFlight = 10_000 }), ""},
		{"max_in_flight 10001", plan(func(p *Plan) { p.MaxInFlight = 10_001 }), "plans.standard.max_in_flight"},
		{"heavy_after_turns 0", plan(func(p *Plan) { p.HeavyAfterTurns = 0 }), "plans.standard.heavy_after_turns"},
		{"heavy_after_turns 1", plan(func(p *Plan) { p.HeavyAfterTurns = 1 }), ""},
		{"discount_bp -1", plan(func(p *Plan) { p.DiscountBP = -1 }), "plans.standard.discount_bp"},
		{"discount_bp 0", plan(func(p *Plan) { p.DiscountBP = 0 }), ""},
		{"discount_bp 10000", plan(func(p *Plan) { p.DiscountBP = 10_000 }), ""},
		{"discount_bp 10001", plan(func(p *Plan) { p.DiscountBP = 10_001 }), "plans.standard.discount_bp"},
		// lease_ttl 30s + 2 x heartbeat 10s = 50s; 3 x 10s + 5s = 35s.
		{"dead_instance_after -1ns", func(c *Config) { c.Holds.DeadInstanceAfter = -1 }, "holds.dead_instance_after"},
		{"dead_instance_after 0 (derived)", func(c *Config) { c.Holds.DeadInstanceAfter = 0 }, ""},
		{"dead_instance_after 49.999s", func(c *Config) { c.Holds.DeadInstanceAfter = 50*time.Second - time.Millisecond }, "holds.dead_instance_after"},
		{"dead_instance_after 50s", func(c *Config) { c.Holds.DeadInstanceAfter = 50 * time.Second }, ""},
		{"dead_instance_after under 3 heartbeats and 5s", func(c *Config) {
			c.Holds.LeaseTTL, c.Holds.HeartbeatInterval, c.Holds.DeadInstanceAfter = 4*time.Second, 2*time.Second, 11*time.Second-1
		}, "holds.dead_instance_after"},
		{"dead_instance_after at 3 heartbeats and 5s", func(c *Config) {
			c.Holds.LeaseTTL, c.Holds.HeartbeatInterval, c.Holds.DeadInstanceAfter = 4*time.Second, 2*time.Second, 11*time.Second
		}, ""},
		{"max_output_tokens -1", func(c *Config) {
			m := c.Models["fake-gpt"]
			m.MaxOutputTokens = -1
			c.Models["fake-gpt"] = m
		}, "models.fake-gpt.max_output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.MySQLDSN = "u:p@tcp(127.0.0.1:3306)/db"
			c.RedisURL = "redis://127.0.0.1:6379/0"
			tc.set(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused at the edge: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted; want %s refused", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want+":"):
				t.Fatalf("error %q does not name %s", err, tc.want)
			}
		})
	}
}
