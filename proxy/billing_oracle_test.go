package proxy_test

import (
	"context"
	"encoding/json"
	"math/big"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// oracleChargeOf is the charge of a call from the money rules alone (DESIGN §2, README "How a
// call is charged"), in math/big: cost = ⌈Σ tokens × price / 10^6⌉ with each part (audio in and
// out, one-hour writes) at its own price, then ⌈cost × (10 000 − bp) / 10 000⌉, clamped to cap.
func oracleChargeOf(u pricing.Usage, p pricing.Price, bp int, capMicro int64) (cost, charged int64) {
	sum := new(big.Int)
	add := func(n, price int64) { sum.Add(sum, new(big.Int).Mul(big.NewInt(n), big.NewInt(price))) }
	add(u.Input-u.AudioInput, p.Input)
	add(u.AudioInput, p.AudioInput)
	add(u.CacheRead, p.CacheRead)
	add(u.CacheWrite-u.CacheWrite1h, p.CacheWrite)
	add(u.CacheWrite1h, p.CacheWrite1h)
	add(u.Output-u.AudioOutput, p.Output)
	add(u.AudioOutput, p.AudioOutput)
	ceil := func(a *big.Int, b int64) *big.Int {
		q, r := new(big.Int).QuoRem(a, big.NewInt(b), new(big.Int))
		if r.Sign() != 0 {
			q.Add(q, big.NewInt(1))
		}
		return q
	}
	c := ceil(sum, 1_000_000)
	ch := ceil(new(big.Int).Mul(c, big.NewInt(int64(10_000-bp))), 10_000)
	if ch.Cmp(big.NewInt(capMicro)) > 0 {
		ch = big.NewInt(capMicro)
	}
	return c.Int64(), ch.Int64()
}

// TestBillingOracleEndToEnd: calls through the real gateway, answered by recorded-shape
// usages (cached input, audio in and out, five-minute and one-hour cache writes, a part larger
// than its whole, a count past any real one), with prices of odd micro-USD so that every
// rounding shows, are settled at the oracle's cost and charge; the allowance and prepaid
// parts sum to the charge, and the day ledger and prepaid credits move by exactly that.
func TestBillingOracleEndToEnd(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "oracle_chat.json", `{"id":"chatcmpl-o1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":5000,"completion_tokens":900,"total_tokens":5900,
"prompt_tokens_details":{"cached_tokens":1200,"audio_tokens":700},"completion_tokens_details":{"audio_tokens":600}}}`)
	writeFixture(t, dir, "oracle_audio_over.json", `{"id":"chatcmpl-o2","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hi."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":1000,"completion_tokens":50,"total_tokens":1050,
"prompt_tokens_details":{"cached_tokens":100,"audio_tokens":2000}}}`)
	writeFixture(t, dir, "oracle_huge.json", `{"id":"chatcmpl-o3","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hi."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":99999999999999999999,"completion_tokens":7,"total_tokens":99999999999999999999}}`)
	writeFixture(t, dir, "oracle_hour.json", `{"content":[{"text":"Python is versatile.","type":"text"}],"id":"msg_o4","model":"claude-test",
"role":"assistant","stop_reason":"end_turn","stop_sequence":null,"type":"message",
"usage":{"cache_creation":{"ephemeral_1h_input_tokens":400,"ephemeral_5m_input_tokens":18},"cache_creation_input_tokens":418,
"cache_read_input_tokens":1111,"input_tokens":3,"output_tokens":33,"service_tier":"standard"}}`)
	usd := func(micro int64) config.USDPerM { return config.USDPerM{Micro: micro} }
	h := newHarnessWithFixtures(t, dir, func(c *config.Config) {
		c.Models["fake-gpt"] = config.ModelCfg{Input: usd(2_500_001), CacheRead: usd(1_250_003), CacheWrite: usd(3_125_007),
			Output: usd(10_000_007), AudioInput: usd(40_000_011), AudioOutput: usd(80_000_013)}
		c.Models["claude-test"] = config.ModelCfg{Input: usd(3_000_001), CacheRead: usd(300_007), CacheWrite: usd(3_750_003),
			CacheWrite1h: usd(6_000_009), Output: usd(15_000_017)}
	})
	table, err := h.cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	priceOf := func(model string) pricing.Price {
		p, _, err := table.Lookup(model)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	const audioPrompt = `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"Transcribe this."},
	{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=","format":"wav"}}]}],
	"modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"}}`
	const streamBody = `{"model":"fake-gpt","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there, tollgate"}]}`
	cases := []struct {
		name, fixture, path, body, model string
		discountBP                       int
		allowance                        int64 // µUSD, the user's own allowance; 0 keeps the plan's
		prepaid                          int64 // µUSD granted before the calls
		calls                            int
		usage                            pricing.Usage // what the fixture reports, as the rules read it
	}{
		{name: "cached and audio, a third off", fixture: "oracle_chat.json", path: "/v1/chat/completions", body: audioPrompt,
			model: "fake-gpt", discountBP: 3333, calls: 1,
			usage: pricing.Usage{Input: 3800, CacheRead: 1200, AudioInput: 700, Output: 900, AudioOutput: 600}},
		{name: "one-hour writes, 1 bp off", fixture: "oracle_hour.json", path: "/v1/messages", body: hourCacheRequest,
			model: "claude-test", discountBP: 1, calls: 1,
			usage: pricing.Usage{Input: 3, CacheRead: 1111, CacheWrite: 418, CacheWrite1h: 400, Output: 33}},
		// README: audio input tokens are billed "at most the uncached prompt".
		{name: "audio part above its whole", fixture: "oracle_audio_over.json", path: "/v1/chat/completions", body: audioPrompt,
			model: "fake-gpt", calls: 1, usage: pricing.Usage{Input: 900, CacheRead: 100, AudioInput: 900, Output: 50}},
		// A count no provider reports: saturated at pricing.MaxTokens, and the charge clamped to the cap.
		{name: "a count past any real one", fixture: "oracle_huge.json", path: "/v1/chat/completions",
			body: `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`, model: "fake-gpt", calls: 1,
			usage: pricing.Usage{Input: pricing.MaxTokens, Output: 7}},
		// A stream of fakellm's own (no replay): its usage chunk, prompt by its tokenizer.
		{name: "a stream", path: "/v1/chat/completions", body: streamBody, model: "fake-gpt", discountBP: 9_999, calls: 2,
			usage: pricing.Usage{Input: fakellm.PromptTokens([]byte(streamBody)), Output: 17}},
		// The day's allowance runs out during the second call: the rest comes from prepaid credits.
		{name: "allowance then prepaid", fixture: "oracle_chat.json", path: "/v1/chat/completions", body: audioPrompt,
			model: "fake-gpt", discountBP: 17, allowance: 100_000, prepaid: 1_000_000, calls: 3,
			usage: pricing.Usage{Input: 3800, CacheRead: 1200, AudioInput: 700, Output: 900, AudioOutput: 600}},
	}
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, key := h.user("standard")
			bp := tc.discountBP
			var allowance *int64
			if tc.allowance != 0 {
				allowance = &tc.allowance
			}
			if err := h.store.SetUserLimits(ctx, u.ID, allowance, nil, &bp); err != nil {
				t.Fatal(err)
			}
			if tc.prepaid != 0 {
				if _, _, err := h.store.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: tc.prepaid,
					IdempotencyKey: "oracle-" + key[:12], Reason: "test"}); err != nil {
					t.Fatal(err)
				}
			}
			planAllowance := plans.FromConfig(h.cfg)["standard"].AllowanceMicro
			if tc.allowance != 0 {
				planAllowance = tc.allowance
			}
			var used, prepaidTaken int64
			for i := range tc.calls {
				hdr := map[string]string{fakellm.HeaderReplay: tc.fixture}
				if tc.fixture == "" {
					hdr = map[string]string{fakellm.HeaderChunks: "17"}
				}
				run, _ := h.answeredRun(u.ID, key, tc.path, tc.body, hdr)
				got := pricing.Usage{Input: run.InTok, CacheRead: run.CacheReadTok, CacheWrite: run.CacheWriteTok, Output: run.OutTok,
					CacheWrite1h: run.CacheWrite1hTok, AudioInput: run.AudioInTok, AudioOutput: run.AudioOutTok}
				if got != tc.usage {
					t.Fatalf("call %d: row's usage %+v, the report says %+v", i, got, tc.usage)
				}
				cost, charged := oracleChargeOf(tc.usage, priceOf(tc.model), bp, run.CapMicro)
				if run.CostMicro != cost || run.ChargedMicro != charged {
					t.Fatalf("call %d: cost %d charged %d, oracle %d and %d (%d bp, cap %d)", i, run.CostMicro, run.ChargedMicro,
						cost, charged, bp, run.CapMicro)
				}
				// DESIGN §2: the settled row stores a snapshot of the prices and discount used.
				var snap struct {
					Snapshot []byte `db:"price_snapshot"`
					BP       int    `db:"discount_bp"`
				}
				if err := h.db.Get(&snap, "SELECT price_snapshot, discount_bp FROM run_holds WHERE run_id = ?", run.RunID); err != nil {
					t.Fatal(err)
				}
				var shot pricing.Price
				if err := json.Unmarshal(snap.Snapshot, &shot); err != nil || shot != priceOf(tc.model) || snap.BP != bp {
					t.Fatalf("call %d: snapshot %s at %d bp, charged at %+v and %d bp (%v)", i, snap.Snapshot, snap.BP, priceOf(tc.model), bp, err)
				}
				fromAllowance := min(charged, max(0, planAllowance-used))
				if run.AllowancePart != fromAllowance || run.PrepaidPart != charged-fromAllowance ||
					run.AllowancePart+run.PrepaidPart != run.ChargedMicro {
					t.Fatalf("call %d: allowance part %d + prepaid part %d of %d, oracle %d + %d (allowance %d, used %d)", i,
						run.AllowancePart, run.PrepaidPart, run.ChargedMicro, fromAllowance, charged-fromAllowance, planAllowance, used)
				}
				used += charged
				prepaidTaken += charged - fromAllowance
			}
			var ledger struct {
				Used int64 `db:"used"`
				Runs int64 `db:"runs"`
			}
			if err := h.db.Get(&ledger, "SELECT COALESCE(SUM(used_micro), 0) AS used, COALESCE(SUM(run_count), 0) AS runs FROM usage_days WHERE user_id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			if ledger.Used != used || ledger.Runs != int64(tc.calls) {
				t.Fatalf("day ledger %d µUSD over %d runs, oracle %d over %d", ledger.Used, ledger.Runs, used, tc.calls)
			}
			var prepaid int64
			if err := h.db.Get(&prepaid, "SELECT prepaid_micro FROM users WHERE id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			if prepaid != tc.prepaid-prepaidTaken {
				t.Fatalf("prepaid %d µUSD, oracle %d − %d", prepaid, tc.prepaid, prepaidTaken)
			}
			if tc.prepaid != 0 && prepaidTaken == 0 {
				t.Fatal("the case meant to cross the allowance took nothing from prepaid")
			}
		})
	}
	// A named run: each call's cost rounded up once (DESIGN §2: "computed once per call"), the
	// run's charge the discount of their sum, rounded up once per run (README "Money").
	t.Run("named run", func(t *testing.T) {
		u, key := h.user("standard")
		bp := 3333
		if err := h.store.SetUserLimits(ctx, u.ID, nil, nil, &bp); err != nil {
			t.Fatal(err)
		}
		calls := []struct {
			fixture, path, body, model string
			usage                      pricing.Usage
		}{
			{"oracle_chat.json", "/v1/chat/completions", audioPrompt, "fake-gpt", cases[0].usage},
			{"oracle_audio_over.json", "/v1/chat/completions", audioPrompt, "fake-gpt", cases[2].usage},
			{"oracle_chat.json", "/v1/chat/completions", audioPrompt, "fake-gpt", cases[0].usage},
		}
		var runID string
		var sum int64
		for i, c := range calls {
			resp := h.post(key, c.path, c.body, map[string]string{fakellm.HeaderReplay: c.fixture, "X-Run-Id": "oracle-run"})
			b := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
			}
			runID = resp.Header.Get(proxy.RunIDHeader)
			cost, _ := oracleChargeOf(c.usage, priceOf(c.model), 0, 1<<62)
			sum += cost
		}
		if status, body := h.settleRun(key, "oracle-run"); status != http.StatusOK {
			t.Fatalf("settle: %d %s", status, body)
		}
		run := h.run(u.ID, runID)
		charged := min(ceilBP(sum, bp), run.CapMicro)
		if run.CostMicro != sum || run.ChargedMicro != charged || run.AllowancePart+run.PrepaidPart != run.ChargedMicro {
			t.Fatalf("named run cost %d charged %d (%d + %d), oracle %d and %d", run.CostMicro, run.ChargedMicro,
				run.AllowancePart, run.PrepaidPart, sum, charged)
		}
		var used int64
		if err := h.db.Get(&used, "SELECT COALESCE(SUM(used_micro), 0) FROM usage_days WHERE user_id = ?", u.ID); err != nil {
			t.Fatal(err)
		}
		if used != charged {
			t.Fatalf("day ledger %d µUSD, oracle %d", used, charged)
		}
	})
}

// ceilBP is ⌈cost × (10 000 − bp) / 10 000⌉, in math/big.
func ceilBP(cost int64, bp int) int64 {
	n := new(big.Int).Mul(big.NewInt(cost), big.NewInt(int64(10_000-bp)))
	q, r := new(big.Int).QuoRem(n, big.NewInt(10_000), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}
