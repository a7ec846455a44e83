package config

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// Credits is an amount of credits written as a decimal (3.412), kept exact in thousandths of a
// credit. It becomes micro-USD only through MicroAt, because credit_micro is itself a setting.
type Credits struct {
	Milli int64
}

// CreditsOf is n whole credits.
func CreditsOf(n int64) Credits { return Credits{Milli: n * 1000} }

// UnmarshalYAML reads the scalar's text, so 0.1 stays exactly one tenth.
func (c *Credits) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDecimal(n.Value, 3)
	if err != nil {
		return fmt.Errorf("line %d: credits %q: %w", n.Line, n.Value, err)
	}
	*c = Credits{Milli: v}
	return nil
}

// MicroAt converts at creditMicro micro-USD per credit, rounding up.
func (c Credits) MicroAt(creditMicro int64) int64 { return (c.Milli*creditMicro + 999) / 1000 }

// USDPerM is a price in USD per million tokens, written as a decimal and kept as micro-USD per
// million tokens (6 decimals, exact).
type USDPerM struct{ Micro int64 }

// UnmarshalYAML reads the scalar's text so no float ever touches a price.
func (p *USDPerM) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDecimal(n.Value, 6)
	if err != nil {
		return fmt.Errorf("line %d: price %q: %w", n.Line, n.Value, err)
	}
	p.Micro = v
	return nil
}

func mustUSD(s string) USDPerM {
	v, err := parseDecimal(s, 6)
	if err != nil {
		panic(err)
	}
	return USDPerM{Micro: v}
}

// parseDecimal parses a non-negative decimal with at most places fraction digits into an
// integer scaled by 10^places.
func parseDecimal(s string, places int) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("empty number")
	}
	if len(frac) > places {
		return 0, fmt.Errorf("more than %d decimal places", places)
	}
	frac += strings.Repeat("0", places-len(frac))
	var v int64
	for _, r := range whole + frac {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("not a non-negative decimal number")
		}
		if v > (1<<62)/10 {
			return 0, fmt.Errorf("too large")
		}
		v = v*10 + int64(r-'0')
	}
	return v, nil
}
