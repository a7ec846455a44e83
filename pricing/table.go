package pricing

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrNotPriced is returned for a model that no configured price matches.
var ErrNotPriced = errors.New("model not priced")

// Table maps model names to prices: exact name first, then the longest configured prefix.
type Table struct {
	exact    map[string]Price
	prefixes []string // longest first
}

// NewTable builds a table. Every key is both an exact name and a prefix, so "gpt-4o" prices
// "gpt-4o" and "gpt-4o-2024-08-06".
func NewTable(prices map[string]Price) (*Table, error) {
	t := &Table{exact: make(map[string]Price, len(prices))}
	for name, p := range prices {
		if strings.TrimSpace(name) == "" {
			return nil, errors.New("pricing: empty model name")
		}
		if err := p.validate(); err != nil {
			return nil, fmt.Errorf("pricing: model %q: %w", name, err)
		}
		t.exact[name] = p
		t.prefixes = append(t.prefixes, name)
	}
	sort.Slice(t.prefixes, func(i, j int) bool {
		if len(t.prefixes[i]) != len(t.prefixes[j]) {
			return len(t.prefixes[i]) > len(t.prefixes[j])
		}
		return t.prefixes[i] < t.prefixes[j]
	})
	return t, nil
}

// Lookup returns the price of model and the configured name that matched it.
func (t *Table) Lookup(model string) (Price, string, error) {
	if p, ok := t.exact[model]; ok {
		return p, model, nil
	}
	for _, prefix := range t.prefixes {
		if strings.HasPrefix(model, prefix) {
			return t.exact[prefix], prefix, nil
		}
	}
	return Price{}, "", fmt.Errorf("%w: %q", ErrNotPriced, model)
}

// Models lists the configured model names, sorted.
func (t *Table) Models() []string {
	out := make([]string, 0, len(t.exact))
	for name := range t.exact {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}
