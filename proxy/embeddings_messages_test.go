package proxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestEmbeddingsChatInputIsEstimated: vLLM's /v1/embeddings takes its input as chat messages
// (`messages` in place of `input`: its chat-style embeddings, the only way to embed an image
// with a multimodal embedding model), and bills them as the prompt; Jina's takes images as
// input objects ({"image": …}, beside {"text": …}). The embeddings estimate read `input`
// alone, and an input object without a type as no text, so such a call was estimated at nothing: a prompt costing five times
// the call's cap passed the check that refuses it (402), was forwarded, and the provider's
// bill past the cap was the operator's loss.
func TestEmbeddingsChatInputIsEstimated(t *testing.T) {
	h, up := jsonHarness(t, func(c *configT) {
		dear := c.Models["fake-gpt"]
		dear.Input.Micro = 1_000_000_000 // 1000 USD per million: 1000 µUSD a token
		c.Models["dear"] = dear
	})
	u, key := h.user("standard")
	// The default cap is 500 credits = 500 000 µUSD: 500 tokens. About 2 500 tokens of text.
	text := strings.Repeat("abcd ", 2000)
	for _, body := range []string{
		`{"model":"dear","messages":[{"role":"user","content":"` + text + `"}]}`,
		`{"model":"dear","messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"}]}],"encoding_format":"float"}`,
		// Jina's multimodal input: objects of "text" or "image" (a URL or base64), an image
		// billed as tokens; estimated at nothing, as an input part without a type.
		`{"model":"dear","input":[{"text":"a photo of the sea"},{"image":"https://example.com/beach.jpg"}]}`,
	} {
		up.mu.Lock()
		before := len(up.seen)
		up.mu.Unlock()
		resp := h.post(key, "/v1/embeddings", body, nil)
		answer := readAll(t, resp.Body)
		resp.Body.Close()
		h.settled()
		up.mu.Lock()
		sent := len(up.seen) - before
		up.mu.Unlock()
		if resp.StatusCode != http.StatusPaymentRequired || sent != 0 {
			run := h.run(u.ID, resp.Header.Get("X-Tollgate-Run-Id"))
			t.Errorf("%d %s, forwarded %d times (in_tok %d, estimated %v, cost %d µUSD, charged %d, cap %d); want 402 and nothing forwarded",
				resp.StatusCode, answer, sent, run.InTok, run.Estimated, run.CostMicro, run.ChargedMicro, run.CapMicro)
		}
	}
}
