package proxy_test

import (
	"bufio"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// spokenRequest asks fake-gpt for a spoken answer.
const spokenRequest = `{"model":"fake-gpt","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},
	"messages":[{"role":"user","content":"Say hello."}]}`

// spokenHarness is a gateway whose fake-gpt prices audio output at 8 times its text output
// (gpt-4o-audio-preview's ratio: 80 against 10 USD/M), with answers replayed from dir.
func spokenHarness(t *testing.T, dir string) (*harness, pricing.Price) {
	return harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	})
}

// writeFixture writes a replay fixture into dir.
func writeFixture(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSpokenAnswerChargedAtItsPrice: a spoken answer's audio tokens, which its usage reports
// in completion_tokens_details, are charged at the audio output price, its transcript's at the
// text price. The request was refused before the price existed.
func TestSpokenAnswerChargedAtItsPrice(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "spoken.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","data":"`+wavSeconds(2)+`","expires_at":1,"transcript":"Hello."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":20,"completion_tokens":300,"total_tokens":320,
"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"audio_tokens":250,"text_tokens":50}}}`)
	h, price := spokenHarness(t, dir)
	u, key := h.user("standard")
	// Answered 200: the model has an audio output price.
	run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken.json"})
	want := price.Cost(pricing.Usage{Input: 20, Output: 300, AudioOutput: 250})
	if run.CostMicro != want || run.ChargedMicro != want || run.Estimated {
		t.Fatalf("run cost %d charged %d estimated %v, want %d reported (250 audio tokens at %d µUSD/M)",
			run.CostMicro, run.ChargedMicro, run.Estimated, want, price.AudioOutput)
	}
	if text := price.Cost(pricing.Usage{Input: 20, Output: 300}); run.ChargedMicro <= text {
		t.Fatalf("charged %d, no more than at the text price (%d)", run.ChargedMicro, text)
	}
	if run.OutTok != 300 {
		t.Fatalf("out_tok %d, want 300 (text and audio)", run.OutTok)
	}
}

// TestSpokenAnswerEstimatedByItsLength: a spoken answer without a usage report is settled at
// an estimate whose audio part follows the audio's length (20 tokens a second) at the audio
// price: a caller who leaves a streamed answer before its usage (which comes last) pays for
// what was spoken, and so does a whole answer from a provider that reports none. Without it,
// only the transcript was counted, at the text price: a fraction of the provider's bill.
func TestSpokenAnswerEstimatedByItsLength(t *testing.T) {
	dir := t.TempDir()
	// Three chunks of a second of 24 kHz 16-bit PCM each: 60 tokens of audio.
	second := base64.StdEncoding.EncodeToString(make([]byte, 48_000))
	chunk := func(delta string) string {
		return `data: {"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[{"index":0,"delta":` + delta + `}]}` + "\n\n"
	}
	head := chunk(`{"role":"assistant","audio":{"id":"audio_1","transcript":"Hello"}}`)
	for range 3 {
		head += chunk(`{"audio":{"data":"` + second + `"}}`)
	}
	tail := chunk(`{},"finish_reason":"stop"`) +
		`data: {"id":"c1","object":"chat.completion.chunk","model":"fake-gpt","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":70,"total_tokens":90,"completion_tokens_details":{"audio_tokens":60}}}` + "\n\n" +
		"data: [DONE]\n\n"
	writeFixture(t, dir, "spoken.sse", head+tail)
	// A stream that spoke, without a transcript, then failed.
	writeFixture(t, dir, "spoken_broken.sse", chunk(`{"role":"assistant","audio":{"id":"audio_1"}}`)+
		chunk(`{"audio":{"data":"`+second+`"}}`)+`data: {"error":{"message":"overloaded","type":"server_error"}}`+"\n\n")
	writeFixture(t, dir, "spoken_unreported.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","data":"`+wavSeconds(2)+`","expires_at":1,"transcript":"Hello."}},"finish_reason":"stop"}]}`)
	h, price := spokenHarness(t, dir)
	u, key := h.user("standard")

	t.Run("stream left before its usage", func(t *testing.T) {
		resp := h.post(key, "/v1/chat/completions", `{"model":"fake-gpt","stream":true,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"pcm16"},
			"messages":[{"role":"user","content":"Say hello."}]}`,
			map[string]string{fakellm.HeaderReplay: "spoken.sse", fakellm.HeaderSplit: strconv.Itoa(len(head)), fakellm.HeaderChunkInterval: "1m"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, readAll(t, resp.Body))
		}
		runID := resp.Header.Get(proxy.RunIDHeader)
		rd := bufio.NewReaderSize(resp.Body, 1<<20)
		for seen := 0; seen < 3; {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("stream ended after %d audio chunks: %v", seen, err)
			}
			if strings.Contains(line, `"data":"`) {
				seen++
			}
		}
		resp.Body.Close() // the caller leaves, the usage never comes
		run := h.run(u.ID, runID)
		if run.SettleSource.String != holds.SourceCancel || !run.Estimated {
			t.Fatalf("run %+v, want an estimated cancel", run)
		}
		if run.OutTok < 60 {
			t.Fatalf("out_tok %d, want at least the 60 tokens of the 3 seconds spoken", run.OutTok)
		}
		if least := price.Cost(pricing.Usage{Output: 60, AudioOutput: 60}); run.CostMicro < least {
			t.Fatalf("cost %d, want at least %d (3 seconds of audio at the audio price)", run.CostMicro, least)
		}
	})
	// A broken stream that had spoken produced output: it is charged for it (not settled at 0
	// as a failure before any output), and its Idempotency-Key replays it rather than
	// running it again.
	t.Run("stream that spoke, then failed", func(t *testing.T) {
		req := `{"model":"fake-gpt","stream":true,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"pcm16"},
			"messages":[{"role":"user","content":"Say goodbye."}]}`
		hdr := map[string]string{fakellm.HeaderReplay: "spoken_broken.sse", "Idempotency-Key": "spoke-then-failed"}
		resp := h.post(key, "/v1/chat/completions", req, hdr)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "overloaded") {
			t.Fatalf("%d %s, want the stream with its error", resp.StatusCode, body)
		}
		run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
		if run.SettleSource.String != holds.SourceStreamError || run.OutTok < 20 {
			t.Fatalf("run %+v, want settled stream_error with at least the 20 tokens of the second spoken", run)
		}
		calls := h.fake.Calls()
		again := h.post(key, "/v1/chat/completions", req, hdr)
		readAll(t, again.Body)
		again.Body.Close()
		if again.Header.Get(proxy.ReplayedHeader) != "true" || h.fake.Calls() != calls {
			t.Fatalf("the retry was run again (replayed %q, upstream calls %d → %d): the spoken answer pinned its key",
				again.Header.Get(proxy.ReplayedHeader), calls, h.fake.Calls())
		}
	})
	t.Run("whole answer without usage", func(t *testing.T) {
		run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_unreported.json"})
		if !run.Estimated || run.OutTok < 40 {
			t.Fatalf("run %+v, want estimated with at least the 40 tokens of the 2-second clip", run)
		}
		if least := price.Cost(pricing.Usage{Output: 40, AudioOutput: 40}); run.CostMicro < least {
			t.Fatalf("cost %d, want at least %d (2 seconds of audio at the audio price)", run.CostMicro, least)
		}
	})
}

// TestSpokenAnswerBoundPricesEveryTokenAsAudio: the output bound of a call asking for a spoken
// answer must fit the cap with every output token at the audio price (how much of the answer
// will be audio is not known). At the text price it let the answer cost 8 times the cap.
func TestSpokenAnswerBoundPricesEveryTokenAsAudio(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		m := c.Models["fake-gpt"]
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
		c.Models["fake-gpt"] = m
	})
	_, key := h.user("standard")
	// The default cap, 500 credits = 500 000 µUSD, pays for 50 000 text output tokens of
	// fake-gpt (10 µUSD each) and 6 250 audio ones (80 µUSD).
	const capText, capAudio = 50_000, 6_250
	sent := func(body string) int64 {
		t.Helper()
		h.postOK(t, key, "/v1/chat/completions", body, nil)
		return up.last(t).Get("max_tokens").Int()
	}
	spoken := sent(`{"model":"fake-gpt","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`)
	if spoken > capAudio {
		t.Fatalf("upstream got max_tokens=%d for a spoken answer: at the audio price the cap pays for %d", spoken, capAudio)
	}
	if text := sent(`{"model":"fake-gpt","max_tokens":90000000,"messages":[{"role":"user","content":"hi"}]}`); text <= capAudio || text > capText {
		t.Fatalf("upstream got max_tokens=%d for a text answer, want within (%d, %d]: text is bound at the text price", text, capAudio, capText)
	}
}

// wavSeconds is n seconds of 8 kHz 8-bit mono WAV, base64.
func wavSeconds(n int) string {
	clip := make([]byte, 44+8000*n)
	copy(clip, "RIFF")
	copy(clip[8:], "WAVEfmt ")
	clip[22], clip[34] = 1, 8 // mono, 8 bits
	clip[24], clip[25] = 0x40, 0x1f
	clip[28], clip[29] = 0x40, 0x1f // 8 000 samples and bytes a second
	return base64.StdEncoding.EncodeToString(clip)
}

// TestAnswerTooLargeToRelayChargedByItsUsage: an answer larger than max_response_bytes cannot
// be passed on (502, not to be retried), but the provider made it and bills it: the call is
// charged the usage at its end, read past the limit. A spoken answer in WAV passes the default 32 MiB after nine
// minutes; it was charged its prompt's estimate alone.
func TestAnswerTooLargeToRelayChargedByItsUsage(t *testing.T) {
	dir := t.TempDir()
	writeFixture(t, dir, "spoken_long.json", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","data":"`+wavSeconds(30)+`","expires_at":1,"transcript":"A long \"usage\": story."}},"finish_reason":"stop"}],
"usage":{"prompt_tokens":20,"completion_tokens":700,"total_tokens":720,"completion_tokens_details":{"audio_tokens":600}},
"service_tier":"default","system_fingerprint":"fp_1"}`)
	h, price := harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	}, func(c *config.Config) { c.Limits.MaxResponseBytes = 64 << 10 })
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", spokenRequest, map[string]string{fakellm.HeaderReplay: "spoken_long.json"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_response_too_large" {
		t.Fatalf("%d %s, want 502 upstream_response_too_large (the clip is 320 KB against 64 KiB)", resp.StatusCode, body)
	}
	// Charged in full, it must not be retried: the OpenAI and Anthropic SDKs retry a 502
	// twice by default unless told not to, and each retry is as large and charged again.
	if got := resp.Header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("X-Should-Retry %q on a 502 charged in full: an SDK retries it, and each retry is charged again", got)
	}
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	want := price.Cost(pricing.Usage{Input: 20, Output: 700, AudioOutput: 600})
	if run.CostMicro != want || run.Estimated || run.SettleSource.String != holds.SourceStreamError {
		t.Fatalf("run %+v, want cost %d from the reported usage (600 audio tokens), not estimated", run, want)
	}
}

// TestSpokenCallOfARunReservesItsAudioWorstCase: a named run's call takes its worst case
// from the run's cap before it is forwarded, and is bounded by what it was granted. A spoken
// call's worst case is every output token at the audio price: reserved at the text price, the
// call was granted an eighth of what its bound needs, and forwarded with an eighth of the
// output it asked for while the run's cap had room for all of it.
func TestSpokenCallOfARunReservesItsAudioWorstCase(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, string(raw))
		mu.Unlock()
		if strings.Contains(string(raw), "first") {
			arrived <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],
"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	h := newHarness(t, func(c *configT) {
		c.Upstreams = []config.Upstream{{Name: "json", Kind: "openai", BaseURL: up.URL, Models: []string{"*"}}}
		m := c.Models["fake-gpt"]
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
		c.Models["fake-gpt"] = m
	})
	_, key := h.user("standard")
	spoken := func(text string, maxTokens int64) string {
		return `{"model":"fake-gpt","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"max_tokens":` +
			strconv.FormatInt(maxTokens, 10) + `,"messages":[{"role":"user","content":"` + text + `"}]}`
	}
	forwarded := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return gjson.Get(seen[len(seen)-1], "max_tokens").Int()
	}
	// A run's first call asking for far more than its cap is lowered to all of it: how many
	// audio tokens the cap pays for.
	probe := h.post(key, "/v1/chat/completions", spoken("probe", 1_000_000_000), map[string]string{"X-Run-Id": "probe"})
	readAll(t, probe.Body)
	probe.Body.Close()
	all := forwarded()
	if probe.StatusCode != http.StatusOK || all < 100 {
		t.Fatalf("probe: %d, forwarded with max_tokens=%d", probe.StatusCode, all)
	}
	// The first call may speak 80 % of that and stays in flight; the second asks for 30 %.
	run := map[string]string{"X-Run-Id": "spoken-task"}
	firstAsks := all * 8 / 10
	first := make(chan int, 1)
	go func() {
		resp := h.post(key, "/v1/chat/completions", spoken("first", firstAsks), run)
		readAll(t, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	select {
	case <-arrived:
	case code := <-first:
		t.Fatalf("the first call ended (%d) before its upstream held it", code)
	case <-time.After(10 * time.Second):
		t.Fatal("the first call did not reach the upstream")
	}
	if got := forwarded(); got != firstAsks {
		t.Errorf("the first call was forwarded with max_tokens=%d, want the %d it asked for: the run's cap pays for %d", got, firstAsks, all)
	}
	resp := h.post(key, "/v1/chat/completions", spoken("second", all*3/10), run)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	close(release)
	if code := <-first; code != http.StatusOK || resp.StatusCode != http.StatusOK {
		t.Fatalf("first %d, second %d %s", code, resp.StatusCode, body)
	}
	// What the run has left beside the first call: 20 % of its cap.
	if second := forwarded(); second > all*2/10+1 {
		t.Fatalf("the second call was forwarded with max_tokens=%d: with the first's %d audio tokens, %d passes the run's cap of %d",
			second, firstAsks, firstAsks+second, all)
	}
}

// TestSpokenAnswerSentBackEstimatedBesideTheText: a conversation that sends an earlier spoken
// answer back, settled without a usage report (a caller who leaves before it), is charged its
// text and the sent-back answer's 1 600 audio tokens. It was charged the larger of the two,
// the audio carved out of the text: 1 600 prompt tokens short on every such call.
func TestSpokenAnswerSentBackEstimatedBesideTheText(t *testing.T) {
	h, price := audioHarness(t, "")
	u, key := h.user("standard")
	text := strings.Repeat("Tell me more. ", 3000)
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":"` + text + `"},
		{"role":"assistant","audio":{"id":"audio_abc123"}},{"role":"user","content":"Again, slower."}]}`
	textOnly := strings.Replace(body, `"audio":{"id":"audio_abc123"}`, `"content":null`, 1)
	run := h.estimatedRun(u.ID, key, body)
	textTokens, _ := metering.EstimatePrompt(metering.FormatChat, []byte(textOnly))
	prompt := textTokens + 1600
	if run.InTok < prompt {
		t.Fatalf("in_tok %d, want at least %d: the text's tokens and the sent-back answer's 1 600", run.InTok, prompt)
	}
	if least := price.Cost(pricing.Usage{Input: prompt, AudioInput: 1600}); run.CostMicro < least {
		t.Fatalf("estimated cost %d, want at least %d", run.CostMicro, least)
	}
}
