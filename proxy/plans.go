package proxy

import (
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// Plans converts the configured plans (credits) to the store's terms (micro-USD). It lives
// here because proxy is the one package that sees both config and holds; holds stays free of
// the config format.
func Plans(cfg *config.Config) map[string]holds.Plan {
	out := make(map[string]holds.Plan, len(cfg.Plans))
	m := func(c config.Credits) int64 { return c.MicroAt(cfg.CreditMicro) }
	for name, p := range cfg.Plans {
		out[name] = holds.Plan{AllowanceMicro: m(p.AllowanceCredits), HoldNormalMicro: m(p.HoldNormalCredits),
			HoldHeavyMicro: m(p.HoldHeavyCredits), HeavyAfterTurns: p.HeavyAfterTurns, MaxInFlight: p.MaxInFlight,
			MaxRunCostMicro: m(p.MaxRunCostCredits), DiscountBP: p.DiscountBP}
	}
	return out
}
