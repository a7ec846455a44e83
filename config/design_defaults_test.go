package config

import (
	"testing"
	"time"
)

// TestDefaultsAreTheDesigns: every default DESIGN.md states is Default()'s (and so a
// configuration's that leaves the setting out, and config.example.yaml's, which
// TestExampleShowsTheDefaults holds to Default()). A default changed in one place and not the
// other is a bill nobody can explain from the design.
func TestDefaultsAreTheDesigns(t *testing.T) {
	d := Default()
	for _, c := range []struct {
		design    string
		got, want any
	}{
		{"§2 one credit = 1000 µUSD (credit_micro)", d.CreditMicro, int64(1000)},
		{"§3.3 hold_ttl default 900 s", d.Holds.HoldTTL, 900 * time.Second},
		// "three times the longest call the gateway allows": upstream_timeout bounds a whole
		// upstream call, stream included.
		{"§3.3 hold_ttl is three times the longest call", d.Holds.HoldTTL, 3 * d.Limits.UpstreamTimeout},
		{"§3.5 lease EX 30", d.Holds.LeaseTTL, 30 * time.Second},
		{"§3.5 lease refreshed every 10 s", d.Holds.HeartbeatInterval, 10 * time.Second},
		{"§3.7 tally TTL 48 h", d.Holds.TallyTTL, 48 * time.Hour},
		{"§5 reconciler every 60 s", d.Holds.ReconcileInterval, 60 * time.Second},
		{"§5 reconcile lock EX 50", d.Holds.ReconcileLockTTL, 50 * time.Second},
		{"§5 200 a batch", d.Holds.ReconcileBatch, 200},
		{"§6 stored responses replayed for 24 h", d.Dedup.ReplayTTL, 24 * time.Hour},
		{"§6 same user + same body within 5 s", d.Dedup.Window, 5 * time.Second},
		{"§6 Redis unreachable -> 503 rather than risk running twice", d.Dedup.FailOpen, false},
	} {
		if c.got != c.want {
			t.Errorf("DESIGN %s: default is %v, want %v", c.design, c.got, c.want)
		}
	}
	// §3.1: "a key lookup may be cached in process for a few seconds".
	if ttl := d.Limits.KeyCacheTTL; ttl <= 0 || ttl > 5*time.Second {
		t.Errorf("DESIGN §3.1 key cache for a few seconds: default key_cache_ttl is %v", ttl)
	}

	// §2 and §3.3: the plans' figures, in credits.
	for name, allowance := range map[string]int64{"standard": 2000, "guest": 100} {
		p, ok := d.Plans[name]
		if !ok {
			t.Errorf("DESIGN §2 names plan %q; the defaults have none", name)
			continue
		}
		for _, c := range []struct {
			design    string
			got, want Credits
		}{
			{"§2 allowance per UTC day", p.AllowanceCredits, CreditsOf(allowance)},
			{"§3.3 hold_normal", p.HoldNormalCredits, CreditsOf(20)},
			{"§3.3 hold_heavy", p.HoldHeavyCredits, CreditsOf(60)},
			{"§3.3 max_run_cost", p.MaxRunCostCredits, CreditsOf(500)},
		} {
			if c.got != c.want {
				t.Errorf("plan %s: DESIGN %s: default is %d milli-credits, want %d", name, c.design, c.got.Milli, c.want.Milli)
			}
		}
		if p.MaxInFlight != 3 {
			t.Errorf("plan %s: DESIGN §3.3 max_in_flight (plan, default 3): default is %d", name, p.MaxInFlight)
		}
		if p.DiscountBP != 0 {
			t.Errorf("plan %s: a default plan at a discount (%d bp) the design does not give", name, p.DiscountBP)
		}
	}
}
