package proxy_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// TestCutCallWritingItsPromptToCacheIsEstimatedAtTheWritePrice: a /v1/messages stream whose
// request marks its prompt with cache_control, broken before message_start (so with no usage),
// was charged its prompt's estimate at the input price, while the provider bills what it wrote
// to its cache at the cache-write price (the one-hour one for a ttl of 1h), as the output bound
// before forwarding already reckons it. The estimate prices the prompt as the bound does; a
// prompt not marked stays at the input price.
func TestCutCallWritingItsPromptToCacheIsEstimatedAtTheWritePrice(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "ping_then_cut.sse", "event: ping\ndata: {\"type\": \"ping\"}\n\n")
	var price pricing.Price
	h := newHarnessWithFixtures(t, dir, func(c *config.Config) {
		m := c.Models["claude-test"]
		m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
		c.Models["claude-test"] = m
		price = pricing.Price{Input: m.Input.Micro, CacheRead: m.CacheRead.Micro, CacheWrite: m.CacheWrite.Micro,
			CacheWrite1h: m.CacheWrite1h.Micro, Output: m.Output.Micro}
	})
	u, key := h.user("standard")
	system := strings.Repeat("You are a careful coding agent. ", 200)
	for _, tc := range []struct {
		name, cacheControl string
		written            func(est int64) pricing.Usage // the prompt as the provider bills it
	}{
		{"five-minute write", `,"cache_control":{"type":"ephemeral"}`,
			func(est int64) pricing.Usage { return pricing.Usage{CacheWrite: est} }},
		{"one-hour write", `,"cache_control":{"type":"ephemeral","ttl":"1h"}`,
			func(est int64) pricing.Usage { return pricing.Usage{CacheWrite: est, CacheWrite1h: est} }},
		{"no cache_control", "", func(est int64) pricing.Usage { return pricing.Usage{Input: est} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"claude-test","max_tokens":100,"stream":true,"system":[{"type":"text","text":"` + system + `"` +
				tc.cacheControl + `}],"messages":[{"role":"user","content":"fix the bug"}]}`
			est, _ := metering.EstimatePrompt(metering.FormatAnthropic, []byte(body))
			_, answer, run := h.postRun(u.ID, key, "/v1/messages", body,
				map[string]string{fakellm.HeaderReplay: "ping_then_cut.sse", fakellm.HeaderDropAfter: "1"})
			if run.State != holds.StateSettled || run.SettleSource.String != holds.SourceStreamError || !run.Estimated {
				t.Fatalf("run %+v (answer %s), want settled as a broken stream, estimated", run, answer)
			}
			if run.Usage().Input != est {
				t.Fatalf("settled %+v, want the prompt's estimate %d", run.Usage(), est)
			}
			if want := price.Cost(tc.written(est)); run.CostMicro != want {
				t.Errorf("cost %d µUSD for a prompt of %d tokens, want %d: the price it is billed at by the provider",
					run.CostMicro, est, want)
			}
			// The row's tokens times its price snapshot still give its cost.
			var raw []byte
			if err := h.db.Get(&raw, "SELECT price_snapshot FROM run_holds WHERE run_id = ?", run.RunID); err != nil {
				t.Fatal(err)
			}
			var snap struct {
				Input        int64 `json:"input"`
				CacheRead    int64 `json:"cache_read"`
				CacheWrite   int64 `json:"cache_write"`
				CacheWrite1h int64 `json:"cache_write_1h"`
				Output       int64 `json:"output"`
			}
			if err := json.Unmarshal(raw, &snap); err != nil {
				t.Fatalf("snapshot %s: %v", raw, err)
			}
			at := pricing.Price{Input: snap.Input, CacheRead: snap.CacheRead, CacheWrite: snap.CacheWrite,
				CacheWrite1h: snap.CacheWrite1h, Output: snap.Output}
			if got := at.Cost(run.Usage()); got != run.CostMicro {
				t.Errorf("tokens %+v at the snapshot %s cost %d µUSD, the row says %d", run.Usage(), raw, got, run.CostMicro)
			}
		})
	}
}
