package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

// TestOversizedAnswerPastItsReadBoundChargedWhatWasRead: an answer too large to relay is read
// past up to four times max_response_bytes for its usage report; one longer than that is cut
// there, with no report of its own. It was charged its prompt's estimate alone, and none of the
// output read past, where an answer a little shorter, read to its end without a report, is
// charged the estimate of all of its output: the longer the answer, the less it cost, down to
// nothing for its output, which the provider made and bills. The output read up to the bound,
// its text and its audio, is charged now, as a stream's output seen before it was cut is.
func TestOversizedAnswerPastItsReadBoundChargedWhatWasRead(t *testing.T) {
	const limit = 64 << 10
	words := strings.Repeat("words ", limit)
	chat := func(message string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":` + message +
			`,"finish_reason":"stop"}]}`
	}
	const seconds = 60 // 480 000 bytes of WAV, 640 000 of base64
	cases := []struct {
		name, path, request, body string
		audio                     bool
	}{
		{"chat text", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","content":"` + words + `"}`), false},
		{"chat spoken", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","content":null,` +
			`"audio":{"id":"audio_1","data":"` + wavSeconds(seconds) + `","expires_at":1,"transcript":"hi"}}`), true},
		{"anthropic text", "/v1/messages", `{"model":"claude-test","max_tokens":64000,"messages":[{"role":"user","content":"Say hello."}]}`,
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"` + words + `"}]}`, false},
	}
	up := &fixedUpstream{}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	h, _ := harnessRepricing(t, "", "fake-gpt", func(m *config.ModelCfg) {
		m.AudioOutput = config.USDPerM{Micro: 8 * m.Output.Micro}
	}, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "anthropic", Kind: "anthropic", BaseURL: ts.URL, Models: []string{"claude*"}},
			{Name: "fixed", Kind: "openai", BaseURL: ts.URL, Models: []string{"*"}}}
		c.Plans["standard"] = bigPlan(c.Plans["standard"])
		c.Limits.MaxResponseBytes = limit
	})
	for _, tc := range cases {
		if len(tc.body) <= 6*limit {
			t.Fatalf("%s: %d bytes, want past what is read of it (four times the limit, and its head)", tc.name, len(tc.body))
		}
		for _, length := range []bool{false, true} {
			u, key := h.user("standard")
			up.set(tc.body, length)
			resp := h.post(key, tc.path, tc.request, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_response_too_large" {
				t.Fatalf("%s (Content-Length %v): %d %s, want 502 upstream_response_too_large", tc.name, length, resp.StatusCode, body)
			}
			got := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if !got.Estimated || got.SettleSource.String != holds.SourceStreamError {
				t.Fatalf("%s (Content-Length %v): run %+v, want an estimate settled stream_error", tc.name, length, got)
			}
			// At least what lies past the limit up to the bound was read and measured; never
			// more than the whole answer holds.
			if tc.audio {
				least, most := int64(20*(4*limit*3/4)/8000), int64(20*seconds)
				if got.AudioOutTok < least || got.AudioOutTok > most {
					t.Errorf("%s (Content-Length %v): %d audio tokens charged, want the audio read, %d to %d", tc.name, length, got.AudioOutTok, least, most)
				}
				continue
			}
			least, most := metering.EstimateOutputTokens(4*limit), metering.EstimateOutputTokens(int64(len(words)))
			if got.OutTok < least || got.OutTok > most {
				t.Errorf("%s (Content-Length %v): %d output tokens charged, want the text read, %d to %d", tc.name, length, got.OutTok, least, most)
			}
		}
	}
}
