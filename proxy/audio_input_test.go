package proxy_test

import (
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// audioRequest is a chat request with one audio clip.
const audioRequest = `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"Transcribe this."},
	{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=","format":"wav"}}]}]}`

// audioHarness is a gateway whose fake-gpt has an audio input price 16 times its text price
// (gpt-4o-audio-preview's ratio), with answers replayed from dir.
func audioHarness(t *testing.T, dir string) (*harness, pricing.Price) {
	return harnessRepricing(t, dir, "fake-gpt", func(m *config.ModelCfg) {
		m.AudioInput = config.USDPerM{Micro: 16 * m.Input.Micro}
	})
}

// TestAudioInputChargedAtItsPrice: a chat call with an audio clip, on a model priced for
// audio, is served and charged the audio tokens its answer reports at the audio price. At the
// text price, the operator paid 16 times what the caller was charged for them.
func TestAudioInputChargedAtItsPrice(t *testing.T) {
	dir := t.TempDir()
	const fixture = "chat_audio_input.json"
	answer := `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,
"message":{"role":"assistant","content":"Hello, billing team."},"finish_reason":"stop"}],
"usage":{"prompt_tokens":1040,"completion_tokens":6,"total_tokens":1046,
"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":1000},"completion_tokens_details":{"audio_tokens":0}}}`
	if err := os.WriteFile(filepath.Join(dir, fixture), []byte(answer), 0o600); err != nil {
		t.Fatal(err)
	}
	h, price := audioHarness(t, dir)
	u, key := h.user("standard")
	resp, _ := h.postOK(t, key, "/v1/chat/completions", audioRequest, map[string]string{fakellm.HeaderReplay: fixture}) // the model has an audio price
	run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	used := pricing.Usage{Input: 1040, AudioInput: 1000, Output: 6}
	if want := price.Cost(used); run.CostMicro != want || run.ChargedMicro != want {
		t.Fatalf("run cost %d charged %d, want %d (the 1000 audio tokens at %d µUSD/M)", run.CostMicro, run.ChargedMicro, want, price.AudioInput)
	}
	if text := price.Cost(pricing.Usage{Input: 1040, Output: 6}); run.ChargedMicro <= text {
		t.Fatalf("charged %d, no more than at the text price (%d)", run.ChargedMicro, text)
	}
	if run.InTok != 1040 {
		t.Fatalf("in_tok %d, want 1040 (text and audio)", run.InTok)
	}
}

// TestAudioInputEstimatedAtItsPrice: a call whose usage never comes (here an upstream that
// reports none) is settled at the estimate of its prompt; the audio clip's share of it is
// priced at the audio price, as the provider will bill it.
func TestAudioInputEstimatedAtItsPrice(t *testing.T) {
	h, price := audioHarness(t, "")
	u, key := h.user("standard")
	body := `{"model":"fake-gpt","messages":[{"role":"user","content":[{"type":"text","text":"Transcribe this."},
		{"type":"input_audio","input_audio":{"data":"` + wavMinute + `","format":"wav"}}]}]}`
	run := h.estimatedRun(u.ID, key, body)
	// The minute of audio is estimated at 600 tokens: at least that many at the audio price.
	if least := price.Cost(pricing.Usage{Input: 600, AudioInput: 600}); run.CostMicro < least {
		t.Fatalf("estimated cost %d, want at least %d (the clip at the audio price)", run.CostMicro, least)
	}
}

// wavMinute is a minute of 8 kHz 8-bit WAV, base64: 600 tokens at ten a second.
var wavMinute = func() string {
	clip := make([]byte, 44+8000*60)
	copy(clip, "RIFF")
	copy(clip[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(clip[28:], 8000)
	return base64.StdEncoding.EncodeToString(clip)
}()

// estimatedRun sends a chat call whose answer reports no usage and returns its settled run,
// which must be estimated.
func (h *harness) estimatedRun(userID uint64, key, body string) holds.Run {
	h.t.Helper()
	run, _ := h.answeredRun(userID, key, "/v1/chat/completions", body, map[string]string{fakellm.HeaderUsage: "off"})
	if !run.Estimated {
		h.t.Fatalf("run %+v not estimated: the test needs an answer without usage", run)
	}
	return run
}
