package config

import (
	"os"
	"path/filepath"
	"testing"
)

// A model whose cache prices are left out bills its cached tokens at its input price: decoded
// as 0, every prompt token OpenAI cached on its own, and every cache write, was served free by a
// config that never said so. A cache price written, 0 included, stands (also through an alias).
func TestUnwrittenCachePricesAreTheInputPrice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	conf := `mysql_dsn: u:p@tcp(127.0.0.1:3306)/tollgate
redis_url: redis://127.0.0.1:6379/0
models:
  gpt-4o: &gpt {input: "2.50", output: "10.00"}
  gpt-4o-copy: *gpt
  read-only: {input: "3.00", output: "15.00", cache_read: "0.30"}
  free-cache: {input: "3.00", output: "15.00", cache_read: "0", cache_write: "0"}
`
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	prices, err := cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model             string
		cacheRead, cacheW int64
	}{
		{"gpt-4o", 2_500_000, 2_500_000},
		{"gpt-4o-copy", 2_500_000, 2_500_000},
		{"read-only", 300_000, 3_000_000},
		{"free-cache", 0, 0},
	} {
		p, _, err := prices.Lookup(c.model)
		if err != nil {
			t.Fatal(err)
		}
		if p.CacheRead != c.cacheRead || p.CacheWrite != c.cacheW {
			t.Errorf("%s: cache_read %d cache_write %d µUSD/M, want %d and %d", c.model, p.CacheRead, p.CacheWrite, c.cacheRead, c.cacheW)
		}
	}
}
