package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestChargedMetricsAddUpToTheLedger: tollgate_charged_micro_usd_total and
// tollgate_billed_tokens_total count what the committed settlements charged and billed —
// calls answered whole and streamed, one cut short by its caller, a named run of two calls
// settled on request, an Anthropic call with cache writes, a refused one — so that a dashboard
// of them agrees with the day ledger and the settled rows.
func TestChargedMetricsAddUpToTheLedger(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, nil)
	h.answeredRun(u.ID, key, "/v1/chat/completions", streamBody, nil)
	left := h.post(key, "/v1/chat/completions", streamBody, slowStream(50, nil))
	firstEvent(t, left)
	left.Body.Close()
	for range 2 {
		sendOK(t, "named run's call", h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "metrics-run"})
	}
	if code, body := h.settleRun(key, "metrics-run"); code != http.StatusOK {
		t.Fatalf("settle: %d %s", code, body)
	}
	h.answeredRun(u.ID, key, "/v1/messages",
		`{"model":"claude-test","max_tokens":500,"system":[{"type":"text","text":"cached","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"anthropic-version": "2023-06-01", fakellm.HeaderReplay: "anthropic_messages_nonstream_cache_read_and_write.json"})
	h.postRefused(t, key, "/v1/chat/completions", `{"model":"fake-gpt","max_tokens":-1,"messages":[]}`, nil, 400, "")
	h.settled()

	var ledger, in, cacheRead, cacheWrite, out int64
	if err := h.db.QueryRow(`SELECT COALESCE(SUM(charged_micro), 0), COALESCE(SUM(in_tok), 0), COALESCE(SUM(cache_read_tok), 0),
		COALESCE(SUM(cache_write_tok), 0), COALESCE(SUM(out_tok), 0) FROM run_holds WHERE user_id = ? AND state = 'settled'`, u.ID).
		Scan(&ledger, &in, &cacheRead, &cacheWrite, &out); err != nil {
		t.Fatal(err)
	}
	if ledger == 0 || in == 0 || out == 0 {
		t.Fatalf("the calls charged %d µUSD, %d input and %d output tokens: the test charged nothing", ledger, in, out)
	}
	series := h.metricSeries("tollgate_charged_micro_usd_total")
	var charged int64
	for _, v := range series {
		charged += v
	}
	if charged != ledger || series[`source="cancel"`] == 0 || series[`source="client"`] == 0 || cacheWrite == 0 || cacheRead == 0 {
		t.Errorf("charged by source %v (sum %d), want the settled rows' %d, the cancel, the named run's and cache tokens included (cache read %d, write %d)",
			series, charged, ledger, cacheRead, cacheWrite)
	}
	tokens := h.metricSeries("tollgate_billed_tokens_total")
	for kind, want := range map[string]int64{"input": in, "cache_read": cacheRead, "cache_write": cacheWrite, "output": out} {
		if got := tokens[`kind="`+kind+`"`]; got != want {
			t.Errorf("billed %s tokens %d, want the settled rows' %d", kind, got, want)
		}
	}
}

// metricSeries reads every series of one metric from /metrics, by its labels.
func (h *harness) metricSeries(name string) map[string]int64 {
	h.t.Helper()
	resp, err := http.Get(h.gw.URL + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int64{}
	for _, line := range strings.Split(string(readAll(h.t, resp.Body)), "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			h.t.Fatalf("metric line %q", line)
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			h.t.Fatalf("metric line %q: %v", line, err)
		}
		out[labels] = int64(f)
	}
	return out
}

// TestBilledTokensCountTheUsageParts: tollgate_billed_tokens_total counts the parts of a
// call's usage under their own kinds — one-hour cache writes as cache_write_1h, the audio of a
// prompt and of an answer as audio_input and audio_output — each as many as the settled row
// holds, as the provider's invoice lists them on their own lines.
func TestBilledTokensCountTheUsageParts(t *testing.T) {
	h := newHarnessWithFixtures(t, partsFixtures(t), partsPrices)
	u, key := h.user("standard")
	spoken, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", spokenAudioRequest, map[string]string{fakellm.HeaderReplay: "spoken_audio.json"})
	cached, _ := h.answeredRun(u.ID, key, "/v1/messages", hourCacheRequest, map[string]string{fakellm.HeaderReplay: "hour_cache.json"})
	h.settled()
	sum := spoken.Usage().Add(cached.Usage())
	if sum != spokenAudioUsage.Add(hourCacheUsage) {
		t.Fatalf("the runs settled with %+v and %+v, want %+v and %+v", spoken.Usage(), cached.Usage(), spokenAudioUsage, hourCacheUsage)
	}
	tokens := h.metricSeries("tollgate_billed_tokens_total")
	for kind, want := range map[string]int64{"input": sum.Input, "cache_read": sum.CacheRead, "cache_write": sum.CacheWrite,
		"output": sum.Output, "cache_write_1h": sum.CacheWrite1h, "audio_input": sum.AudioInput, "audio_output": sum.AudioOutput} {
		if got := tokens[`kind="`+kind+`"`]; got != want {
			t.Errorf("billed %s tokens %d, want the settled rows' %d (%v)", kind, got, want, tokens)
		}
	}
}
