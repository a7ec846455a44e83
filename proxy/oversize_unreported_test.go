package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestOversizedUnreportedAnswerChargedAsReadWhole: an answer too large to relay (502
// upstream_response_too_large) that is read past to its end with no usage report in it was
// charged the prompt's estimate alone, where the same answer read whole is charged its output
// too, estimated from its text and its audio: the provider made it and bills it whether or
// not the gateway passes it on. The output read past is measured as it goes by now, and the
// charge is the whole-read one, whether the answer's Content-Length said it was too large or
// it was read past the limit.
func TestOversizedUnreportedAnswerChargedAsReadWhole(t *testing.T) {
	words := strings.Repeat("words ", 30_000)
	chat := func(message string) string {
		return `{"id":"chatcmpl-1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":` + message +
			`,"finish_reason":"stop"}],"service_tier":"default"}`
	}
	cases := []struct{ name, path, request, body string }{
		{"chat text", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","content":"` + words + `"}`)},
		{"chat escaped text and reasoning", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","reasoning_content":"` +
			strings.ReplaceAll(words[:90_000], " ", `\n`) + `","content":"\u00e9` + words[:90_000] + `","refusal":null}`)},
		{"chat tool call", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",` +
			`"function":{"name":"f","arguments":"{\"text\":\"` + words + `\"}"}}]}`)},
		{"chat spoken", "/v1/chat/completions", spokenRequest, chat(`{"role":"assistant","content":null,` +
			`"audio":{"id":"audio_1","data":"` + wavSeconds(30) + `","expires_at":1,"transcript":"` + words[:60_000] + `"}}`)},
		{"completions", "/v1/completions", `{"model":"fake-gpt","prompt":"Say hello."}`,
			`{"id":"cmpl-1","object":"text_completion","model":"fake-gpt","choices":[{"index":0,"text":"` + words + `","finish_reason":"stop"}]}`},
	}
	up := &fixedUpstream{}
	const limit = 128 << 10
	small, _ := spokenGateway(t, up, limit)
	whole, _ := spokenGateway(t, up, 32<<20)
	for _, tc := range cases {
		chargedAsReadWhole(t, small, whole, up, limit, oversizedCase{name: tc.name, path: tc.path, request: tc.request,
			empty: `{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[]}`, body: tc.body})
	}
}

// oversizedCase is an answer too large to relay, asked for by request on path, and the same
// answer with nothing in it (empty), whose charge is the prompt's estimate alone.
type oversizedCase struct{ name, path, request, empty, body string }

// chargedAsReadWhole has tc's answer read whole through whole, then too large to relay
// through small (limit), with and without a Content-Length, and wants it charged the same:
// its output estimated from what was read past, not the prompt's estimate alone. Each call
// takes fresh users: a case spends much of a day's allowance.
func chargedAsReadWhole(t *testing.T, small, whole *harness, up *fixedUpstream, limit int, tc oversizedCase) {
	t.Helper()
	su, skey := small.user("standard")
	wu, wkey := whole.user("standard")
	if len(tc.body) <= limit || len(tc.body) > 4*limit {
		t.Fatalf("%s: %d bytes, want over the limit and within what is read past it", tc.name, len(tc.body))
	}
	up.set(tc.empty, false)
	resp := whole.post(wkey, tc.path, tc.request, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	promptOnly := whole.run(wu.ID, resp.Header.Get(proxy.RunIDHeader))
	up.set(tc.body, false)
	resp = whole.post(wkey, tc.path, tc.request, nil)
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s read whole: %d", tc.name, resp.StatusCode)
	}
	want := whole.run(wu.ID, resp.Header.Get(proxy.RunIDHeader))
	if !want.Estimated || want.OutTok < 10_000 || want.CostMicro <= 2*promptOnly.CostMicro {
		t.Fatalf("%s read whole: run %+v, want its output estimated (the prompt's estimate alone costs %d)", tc.name, want, promptOnly.CostMicro)
	}
	for _, length := range []bool{false, true} {
		up.set(tc.body, length)
		resp := small.post(skey, tc.path, tc.request, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || errorCode(t, body) != "upstream_response_too_large" {
			t.Fatalf("%s (Content-Length %v): %d %s, want 502 upstream_response_too_large", tc.name, length, resp.StatusCode, body)
		}
		got := small.run(su.ID, resp.Header.Get(proxy.RunIDHeader))
		if got.CostMicro != want.CostMicro || got.OutTok != want.OutTok || !got.Estimated ||
			got.SettleSource.String != holds.SourceStreamError {
			t.Errorf("%s (Content-Length %v): too large to relay, run %+v; read whole, cost %d, %d output tokens",
				tc.name, length, got, want.CostMicro, want.OutTok)
		}
	}
}
