// Package plans converts the configured plans (credits) to the store's terms (micro-USD). It
// is the one place that sees both config and holds for it: holds stays free of the config
// format, and a command that needs a store (the gateway's, the load generator's) need not
// import the proxy.
package plans

import (
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// FromConfig is cfg's plans in the store's terms.
func FromConfig(cfg *config.Config) map[string]holds.Plan {
	out := make(map[string]holds.Plan, len(cfg.Plans))
	m := func(c config.Credits) int64 { return c.MicroAt(cfg.CreditMicro) }
	for name, p := range cfg.Plans {
		out[name] = holds.Plan{AllowanceMicro: m(p.AllowanceCredits), HoldNormalMicro: m(p.HoldNormalCredits),
			HoldHeavyMicro: m(p.HoldHeavyCredits), HeavyAfterTurns: p.HeavyAfterTurns, MaxInFlight: p.MaxInFlight,
			MaxRunCostMicro: m(p.MaxRunCostCredits), DiscountBP: p.DiscountBP}
	}
	return out
}
