package proxy_test

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
	"github.com/tollgate/tollgate/proxy"
)

// fixedUpstream answers every call with the body it is set to, with its Content-Length or
// without one (chunked).
type fixedUpstream struct {
	mu     sync.Mutex
	body   string
	length bool
}

func (u *fixedUpstream) set(body string, length bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.body, u.length = body, length
}

func (u *fixedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	body, length := u.body, u.length
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if length {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(http.StatusOK)
	// In pieces, so that a body without its length goes chunked.
	for b := body; len(b) > 0; {
		n := min(len(b), 16<<10)
		if _, err := io.WriteString(w, b[:n]); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		b = b[n:]
	}
}

// spokenGateway is a gateway forwarding to up whose fake-gpt prices audio output at 8 times
// its text output, answers bounded at limit bytes.
func spokenGateway(t *testing.T, up http.Handler, limit int64) (*harness, pricing.Price) {
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	return harnessRepricing(t, "", "fake-gpt", func(m *config.ModelCfg) {
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Limits.MaxResponseBytes = limit
	})
}

// mp3Seconds is n seconds of MPEG-1 Layer III at 32 kbit/s and 32 kHz, base64: 144-byte
// frames of 36 ms each.
func mp3Seconds(n int) string {
	frame := make([]byte, 144)
	copy(frame, []byte{0xff, 0xfb, 0x1<<4 | 0x2<<2, 0})
	return base64.StdEncoding.EncodeToString(bytes.Repeat(frame, n*1000/36))
}

// TestOversizedSpokenAnswerChargedAsReadWhole: an answer too large to relay (502
// upstream_response_too_large) is charged the usage report at its end. From a provider whose
// report does not say how much of the output was audio, the audio read past went unmeasured
// and was charged at the text price, where the same answer read whole has its audio estimated
// and charged at the audio price (8 times the text price here). It is measured as it goes by
// now, and the charge is the whole-read one, whether the answer's Content-Length said it was
// too large or it was read past the limit; a report that splits out the audio, and an answer
// that speaks nothing, are charged as before.
func TestOversizedSpokenAnswerChargedAsReadWhole(t *testing.T) {
	answer := func(data, usage string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
			`"audio":{"id":"audio_1","data":"` + data + `","expires_at":1,"transcript":"A long story."}},"finish_reason":"stop"}],` +
			`"usage":` + usage + `,"service_tier":"default"}`
	}
	const unsplit = `{"prompt_tokens":20,"completion_tokens":700,"total_tokens":720}`
	pcm := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1, 2, 3, 4, 5}, 48_000*5/5)) // 5 s of 24 kHz 16-bit
	cases := []struct {
		name, body string
		estimated  bool
	}{
		{"wav", answer(wavSeconds(30), unsplit), true},
		{"wav with escaped slashes", answer(strings.ReplaceAll(wavSeconds(30), "/", `\/`), unsplit), true},
		{"mp3", answer(mp3Seconds(40), unsplit), true},
		{"pcm", answer(pcm, unsplit), true},
		{"two choices", strings.Replace(answer(wavSeconds(10), unsplit), `"finish_reason":"stop"}`,
			`"finish_reason":"stop"},{"index":1,"message":{"role":"assistant","audio":{"id":"audio_2","data":"`+mp3Seconds(12)+`"}}}`, 1), true},
		{"audio tokens reported", answer(wavSeconds(30), `{"prompt_tokens":20,"completion_tokens":700,"total_tokens":720,"completion_tokens_details":{"audio_tokens":600}}`), false},
		{"no audio", `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			strings.Repeat("words ", 60_000) + `"},"finish_reason":"stop"}],"usage":` + unsplit + `}`, false},
	}
	up := &fixedUpstream{}
	const limit = 128 << 10
	small, price := spokenGateway(t, up, limit)
	whole, _ := spokenGateway(t, up, 32<<20)
	su, skey := small.user("standard")
	wu, wkey := whole.user("standard")
	textOnly := price.Cost(pricing.Usage{Input: 20, Output: 700})
	for _, tc := range cases {
		if len(tc.body) <= limit || len(tc.body) > 4*limit {
			t.Fatalf("%s: %d bytes, want over the limit and within what is read past it", tc.name, len(tc.body))
		}
		up.set(tc.body, false)
		resp := whole.post(wkey, "/v1/chat/completions", spokenRequest, nil)
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s read whole: %d", tc.name, resp.StatusCode)
		}
		want := whole.run(wu.ID, resp.Header.Get(proxy.RunIDHeader))
		if want.Estimated != tc.estimated || (tc.estimated && want.CostMicro <= textOnly) {
			t.Fatalf("%s read whole: run %+v, want estimated %v and, estimated, more than the text price's %d", tc.name, want, tc.estimated, textOnly)
		}
		for _, length := range []bool{false, true} {
			up.set(tc.body, length)
			resp := small.post(skey, "/v1/chat/completions", spokenRequest, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_response_too_large" {
				t.Fatalf("%s (Content-Length %v): %d %s, want 502 upstream_response_too_large", tc.name, length, resp.StatusCode, body)
			}
			got := small.run(su.ID, resp.Header.Get(proxy.RunIDHeader))
			if got.CostMicro != want.CostMicro || got.OutTok != want.OutTok || got.Estimated != want.Estimated ||
				got.SettleSource.String != holds.SourceStreamError {
				t.Errorf("%s (Content-Length %v): too large to relay, run %+v; read whole, cost %d, %d output tokens, estimated %v",
					tc.name, length, got, want.CostMicro, want.OutTok, want.Estimated)
			}
		}
	}
}
