package proxy_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestContinuedResponseEstimatedWithItsContext: a Responses request that continues an earlier
// answer (previous_response_id) or a conversation carries their context on the provider's
// side, billed as input though the body holds only the new turn. A caller that leaves the
// stream before response.completed is charged an estimate, which must count that context as
// the earlier answer reported it: estimated from the body alone, the 50 000 tokens of
// context the provider billed were charged as nothing.
func TestContinuedResponseEstimatedWithItsContext(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	const context = 50_000
	for _, tc := range []struct{ name, first, next string }{
		{"previous_response_id", `{"model":"fake-gpt","input":"Read this long document."}`,
			`{"model":"fake-gpt","stream":true,"previous_response_id":"%s","input":"Summarise it."}`},
		{"conversation", `{"model":"fake-gpt","conversation":"conv_42","input":"Read this long document."}`,
			`{"model":"fake-gpt","stream":true,"conversation":{"id":"conv_42"},"input":"Summarise it."}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(key, "/v1/responses", tc.first, map[string]string{fakellm.HeaderPromptTokens: "50000"})
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("first: %d %s", resp.StatusCode, body)
			}
			first := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if first.InTok < context {
				t.Fatalf("first answer in_tok %d, want the %d reported", first.InTok, context)
			}
			handed := first.InTok + first.CacheReadTok + first.CacheWriteTok + first.OutTok

			next := strings.Replace(tc.next, "%s", gjson.GetBytes(body, "id").Str, 1)
			resp = h.post(key, "/v1/responses", next, map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("next: %d %s", resp.StatusCode, readAll(t, resp.Body))
			}
			runID := resp.Header.Get(proxy.RunIDHeader)
			rd := bufio.NewReader(resp.Body)
			for range 3 {
				if _, err := rd.ReadString('\n'); err != nil {
					t.Fatal(err)
				}
			}
			resp.Body.Close() // the caller leaves before response.completed
			run := h.run(u.ID, runID)
			if run.SettleSource.String != holds.SourceCancel || !run.Estimated {
				t.Fatalf("run %+v, want an estimated cancel", run)
			}
			if run.InTok < handed {
				t.Fatalf("estimated in_tok %d, want at least the %d tokens of context the first answer handed on", run.InTok, handed)
			}

			// Another user naming the same answer or conversation continues nothing of theirs.
			other, otherKey := h.user("standard")
			resp = h.post(otherKey, "/v1/responses", next, map[string]string{fakellm.HeaderChunks: "500", fakellm.HeaderChunkInterval: "20ms"})
			runID = resp.Header.Get(proxy.RunIDHeader)
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if run := h.run(other.ID, runID); run.InTok >= context {
				t.Fatalf("another user's estimate took the first user's context: in_tok %d", run.InTok)
			}
		})
	}
}
