package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestPromptOverTheCapIsRefusedOnEveryRoute: a call whose prompt alone costs more than its cap
// is refused (402) before it is forwarded: no output bound can bring it within the cap, and
// forwarded, the provider bills the whole prompt while the charge is clamped to the cap, the
// rest the operator's loss. The chat routes were refused so; embeddings, which have no output
// bound to lower, skipped the check and were forwarded whatever their prompt cost. So were
// embeddings whose input the estimate did not read: vLLM's chat-style ones (`messages` in
// place of `input`, the way to embed an image with a multimodal embedding model) and Jina's
// image inputs (`{"image": …}` beside `{"text": …}`, an input part without a type), estimated
// at nothing.
func TestPromptOverTheCapIsRefusedOnEveryRoute(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		dear := c.Models["fake-gpt"]
		dear.Input.Micro = 1_000_000_000 // 1000 USD per million: 1000 µUSD a token
		c.Models["dear"] = dear
	})
	u, key := h.user("standard")
	// The default cap is 500 credits = 500 000 µUSD: 500 tokens of this prompt. About 2 500
	// tokens' worth of text (4 bytes a token) costs five times that.
	text := strings.Repeat("abcd ", 2000)
	cases := []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"dear","max_tokens":10,"messages":[{"role":"user","content":"` + text + `"}]}`},
		{"embeddings", "/v1/embeddings", `{"model":"dear","input":"` + text + `"}`},
		{"embeddings of messages", "/v1/embeddings", `{"model":"dear","messages":[{"role":"user","content":"` + text + `"}]}`},
		{"embeddings of message parts", "/v1/embeddings",
			`{"model":"dear","messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"}]}],"encoding_format":"float"}`},
		// An image billed as tokens: 1 600 of them, as the gateway reckons a media part.
		{"embeddings of an image", "/v1/embeddings", `{"model":"dear","input":[{"text":"a photo of the sea"},{"image":"https://example.com/beach.jpg"}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up.mu.Lock()
			before := len(up.seen)
			up.mu.Unlock()
			resp := h.post(key, tc.path, tc.body, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			h.settled()
			up.mu.Lock()
			sent := len(up.seen) - before
			up.mu.Unlock()
			if resp.StatusCode != http.StatusPaymentRequired || sent != 0 {
				run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
				t.Fatalf("%d %s, forwarded %d times (cost %d µUSD, charged %d, cap %d); want 402 and nothing forwarded",
					resp.StatusCode, body, sent, run.CostMicro, run.ChargedMicro, run.CapMicro)
			}
			if code := errorCode(t, body); code != "insufficient_credits" {
				t.Errorf("refused with %q, want insufficient_credits", code)
			}
		})
	}
}

// TestPromptOverTheCapSaysWhy: the 402 of a prompt that its hold's cap cannot pay names that
// reason. It said "No credits available: … used or held by calls in flight", the answer for an
// empty balance, to a user whose /v1/credits showed thousands available and nothing in flight:
// an operator reading it looked for a spent allowance that was not there.
func TestPromptOverTheCapSaysWhy(t *testing.T) {
	h, _ := jsonHarness(t, func(c *configT) {
		dear := c.Models["fake-gpt"]
		dear.Input.Micro = 1_000_000_000
		c.Models["dear"] = dear
	})
	_, key := h.user("standard")
	text := strings.Repeat("abcd ", 2000)
	resp := h.post(key, "/v1/chat/completions", `{"model":"dear","max_tokens":10,"messages":[{"role":"user","content":"`+text+`"}]}`, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	if resp.StatusCode != http.StatusPaymentRequired || errorCode(t, body) != "insufficient_credits" {
		t.Fatalf("%d %s; want 402 insufficient_credits", resp.StatusCode, body)
	}
	msg := string(body)
	if strings.Contains(msg, "No credits available") || !strings.Contains(msg, "prompt") {
		t.Errorf("message %s: want it to say the prompt costs more than the call may spend, not that no credits are available", body)
	}
}

// TestEmbeddingsPromptAtTheCapIsForwarded: the cap bounds what a call may cost, so an
// embeddings prompt whose estimate costs exactly the cap is within it and forwarded; one
// token more is refused. (Refusing at the cap turned away calls the caller's cap allows.)
func TestEmbeddingsPromptAtTheCapIsForwarded(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		dear := c.Models["fake-gpt"]
		dear.Input.Micro = 1_000_000_000 // 1000 µUSD a token: the default cap of 500 000 µUSD is 500 tokens
		c.Models["dear"] = dear
	})
	_, key := h.user("standard")
	for _, tc := range []struct {
		name   string
		text   string
		status int
	}{
		{"at the cap", strings.Repeat("abcd", 500), http.StatusOK},                   // 500 tokens
		{"a token past it", strings.Repeat("abcd", 501), http.StatusPaymentRequired}, // 501
	} {
		t.Run(tc.name, func(t *testing.T) {
			postForwardedOnceIfOK(t, h, up, key, "/v1/embeddings", `{"model":"dear","input":"`+tc.text+`"}`, tc.status)
		})
	}
}

// TestOutputBoundAtTheLeastIsForwarded: when the cap leaves room for exactly the least output
// bound a route takes (1 token for chat), the call fits: it is forwarded with that bound, not
// refused as a budget too small. The prompt a token larger leaves no output, and is refused.
func TestOutputBoundAtTheLeastIsForwarded(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		dear := c.Models["fake-gpt"]
		// 1000 µUSD a token either way: the default cap of 500 000 µUSD is 500 tokens.
		dear.Input.Micro, dear.Output.Micro = 1_000_000_000, 1_000_000_000
		c.Models["dear"] = dear
	})
	_, key := h.user("standard")
	// One message (4 tokens) and 4 bytes a token: 499 and 500 prompt tokens.
	for _, tc := range []struct {
		name   string
		text   string
		status int
	}{
		{"room for one token", strings.Repeat("abcd", 495), http.StatusOK},
		{"room for none", strings.Repeat("abcd", 496), http.StatusPaymentRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			postForwardedOnceIfOK(t, h, up, key, "/v1/chat/completions",
				`{"model":"dear","max_tokens":10,"messages":[{"role":"user","content":"`+tc.text+`"}]}`, tc.status)
			if tc.status == http.StatusOK {
				if got := up.last(t).Get("max_tokens").Int(); got != 1 {
					t.Errorf("forwarded with max_tokens %d, want 1", got)
				}
			}
		})
	}
}

// postForwardedOnceIfOK posts body and checks that it is answered status, and forwarded once
// when that is 200 and never otherwise.
func postForwardedOnceIfOK(t *testing.T, h *harness, up *jsonUpstream, key, path, body string, status int) {
	t.Helper()
	up.mu.Lock()
	before := len(up.seen)
	up.mu.Unlock()
	resp := h.post(key, path, body, nil)
	answer := readAll(t, resp.Body)
	resp.Body.Close()
	h.settled()
	up.mu.Lock()
	sent := len(up.seen) - before
	up.mu.Unlock()
	if resp.StatusCode != status || (sent == 1) != (status == http.StatusOK) {
		t.Fatalf("%d %s, forwarded %d times; want %d", resp.StatusCode, answer, sent, status)
	}
}
