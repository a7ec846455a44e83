package proxy_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// spokenAudioRequest sends fake-gpt an audio clip and asks for a spoken answer.
const spokenAudioRequest = `{"model":"fake-gpt","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},
	"messages":[{"role":"user","content":[{"type":"text","text":"Transcribe this."},
	{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=","format":"wav"}}]}]}`

// hourCacheRequest asks claude-test to cache its system prompt for an hour.
const hourCacheRequest = `{"model":"claude-test","max_tokens":50,
	"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],
	"messages":[{"role":"user","content":"hi"}]}`

// The usage of the answers partsFixtures replays: a spoken answer to an audio prompt, and an
// Anthropic answer that wrote its prompt to the one-hour cache.
var (
	spokenAudioUsage = pricing.Usage{Input: 1040, AudioInput: 1000, Output: 300, AudioOutput: 250}
	hourCacheUsage   = pricing.Usage{Input: 3, CacheRead: 1111, CacheWrite: 418, CacheWrite1h: 400, Output: 33}
)

// partsFixtures writes the answers of spokenAudioRequest (spoken_audio.json) and
// hourCacheRequest (hour_cache.json) into a new directory.
func partsFixtures(t *testing.T) string {
	dir := t.TempDir()
	writeFixture(t, dir, "spoken_audio.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","data":"`+wavSeconds(2)+`","expires_at":1,"transcript":"Hello."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":1040,"completion_tokens":300,"total_tokens":1340,
"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":1000},"completion_tokens_details":{"audio_tokens":250,"text_tokens":50}}}`)
	writeFixture(t, dir, "hour_cache.json", `{"content":[{"text":"Python is versatile.","type":"text"}],"id":"msg_01","model":"claude-test",
"role":"assistant","stop_reason":"end_turn","stop_sequence":null,"type":"message",
"usage":{"cache_creation":{"ephemeral_1h_input_tokens":400,"ephemeral_5m_input_tokens":18},"cache_creation_input_tokens":418,
"cache_read_input_tokens":1111,"input_tokens":3,"output_tokens":33,"service_tier":"standard"}}`)
	return dir
}

// partsPrices prices fake-gpt's audio in and out and claude-test's one-hour cache writes.
func partsPrices(c *config.Config) {
	m := c.Models["fake-gpt"]
	m.AudioInput, m.AudioOutput = config.USDPerM{Micro: 16 * m.Input.Micro}, config.USDPerM{Micro: 8 * m.Output.Micro}
	c.Models["fake-gpt"] = m
	m = c.Models["claude-test"]
	m.CacheWrite1h = config.USDPerM{Micro: 2 * m.Input.Micro}
	c.Models["claude-test"] = m
}

// checkRunView checks the caller's own view of a run (GET /v1/runs/{id}) shows want's tokens,
// their one-hour cache write and audio parts included.
func (h *harness) checkRunView(key, id string, want pricing.Usage) {
	h.t.Helper()
	status, view := h.get(key, "/v1/runs/"+id)
	usage, _ := view["usage"].(map[string]any)
	if status != http.StatusOK || usage == nil {
		h.t.Fatalf("GET /v1/runs/%s: %d %v", id, status, view)
	}
	for k, n := range map[string]int64{"input": want.Input, "cache_write": want.CacheWrite, "output": want.Output,
		"cache_write_1h": want.CacheWrite1h, "audio_input": want.AudioInput, "audio_output": want.AudioOutput} {
		if usage[k] != float64(n) {
			h.t.Errorf("GET /v1/runs/%s usage %v: %s %v, want %d", id, usage, k, usage[k], n)
		}
	}
}

// TestUsagePartsOfCallsStoredApart: one-hour cache writes and audio tokens were priced at
// their own rates but stored only in the totals they are part of, so the run's row, the usage
// report and the run views could not say how many there were, while the provider's invoice
// lists them on their own lines. A one-call run's settlement, a named run's record of each
// call and its settlement on request keep them, and the caller's run view shows them.
func TestUsagePartsOfCallsStoredApart(t *testing.T) {
	h := newHarnessWithFixtures(t, partsFixtures(t), partsPrices)
	u, key := h.user("standard")

	spoken, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", spokenAudioRequest, map[string]string{fakellm.HeaderReplay: "spoken_audio.json"})
	if spoken.Usage() != spokenAudioUsage || spoken.Estimated {
		t.Errorf("spoken run settled with %+v (estimated %v), want %+v", spoken.Usage(), spoken.Estimated, spokenAudioUsage)
	}
	h.checkRunView(key, spoken.RunID, spokenAudioUsage)

	cached, _ := h.answeredRun(u.ID, key, "/v1/messages", hourCacheRequest, map[string]string{fakellm.HeaderReplay: "hour_cache.json"})
	if cached.Usage() != hourCacheUsage {
		t.Errorf("one-hour cache run settled with %+v, want %+v", cached.Usage(), hourCacheUsage)
	}
	h.checkRunView(key, cached.RunID, hourCacheUsage)

	// A named run of two spoken calls: its row records each as it ends, and its settlement
	// on request keeps their sum.
	hdr := map[string]string{fakellm.HeaderReplay: "spoken_audio.json", "X-Run-Id": "parts-task"}
	var runID string
	for range 2 {
		resp, _ := h.postOK(t, key, "/v1/chat/completions", spokenAudioRequest, hdr) // named run's call
		runID = resp.Header.Get(proxy.RunIDHeader)
	}
	h.settled()
	twice := spokenAudioUsage.Add(spokenAudioUsage)
	live, err := h.store.Run(context.Background(), u.ID, runID)
	if err != nil {
		t.Fatal(err)
	}
	if live.State == holds.StateSettled || live.Usage() != twice {
		t.Errorf("live named run's row (%s) records %+v, want its two calls' %+v", live.State, live.Usage(), twice)
	}
	h.checkRunView(key, "parts-task", twice) // live: from its tally
	if status, body := h.settleRun(key, "parts-task"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled || r.Usage() != twice {
		t.Errorf("named run settled (%s) with %+v, want %+v", r.State, r.Usage(), twice)
	}
	h.checkRunView(key, "parts-task", twice)
}

// TestUsagePartsKeptWhenReconciledFromTheTally: a call's process never settled it (here its
// settlement gave up, the database out of reach; a kill -9 does the same), so the reconciler
// settles the run from its Redis tally, which carried the totals only: the run's one-hour
// cache writes and audio tokens were lost from its row and from the report. They are kept.
func TestUsagePartsKeptWhenReconciledFromTheTally(t *testing.T) {
	dsn, lossy := testenv.LossyMySQLDSN(t)
	db := testenv.Open(t, dsn)
	h := newHarnessOn(t, harnessSetup{db: db, fixturesDir: partsFixtures(t)}, func(c *config.Config) {
		partsPrices(c)
		c.Limits.AdmitTimeout, c.Limits.SettleTimeout = time.Second, time.Second
	})
	u, key := h.user("standard")
	want := map[string]pricing.Usage{}
	for _, c := range []struct{ path, body, fixture string }{
		{"/v1/chat/completions", spokenAudioRequest, "spoken_audio.json"},
		{"/v1/messages", hourCacheRequest, "hour_cache.json"},
	} {
		resp := postSettlementLost(t, h, lossy, key, c.path, c.body, map[string]string{fakellm.HeaderReplay: c.fixture})
		want[resp.Header.Get(proxy.RunIDHeader)] = map[string]pricing.Usage{
			"spoken_audio.json": spokenAudioUsage, "hour_cache.json": hourCacheUsage}[c.fixture]
	}
	if st := h.reconcileExpired(t, "user_id = ? AND state = 'running'", u.ID); st.FromTally != 2 {
		t.Fatalf("reconcile: %+v; want both runs settled from their tallies", st)
	}
	for id, usage := range want {
		r := h.run(u.ID, id)
		if r.SettleSource.String != holds.SourceReconcile || r.Usage() != usage {
			t.Errorf("run %s settled by %q with %+v, want by the reconciler with %+v", id, r.SettleSource.String, r.Usage(), usage)
		}
	}
}
