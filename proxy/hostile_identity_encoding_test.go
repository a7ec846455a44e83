package proxy_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestHostileIdentityEncodingIsPlain: identity is no encoding (RFC 9110 §8.4.1): an answer
// labelled identity alone is plain, and one labelled identity and gzip is in gzip alone. Each
// is relayed and metered as its plain or gzip twin is. Taken for an encoding the gateway did
// not ask for, either was refused 502 upstream_broken and charged its prompt's estimate,
// though the gateway could read it.
func TestHostileIdentityEncodingIsPlain(t *testing.T) {
	var packed bytes.Buffer
	zw := gzip.NewWriter(&packed)
	zw.Write([]byte(plainAnswer))
	zw.Close()
	for _, tc := range []struct {
		name    string
		codings []string
		body    []byte
	}{
		{"identity", []string{"identity"}, []byte(plainAnswer)},
		{"identity then gzip", []string{"identity", "gzip"}, packed.Bytes()},
		{"identity, gzip on one line", []string{"Identity, gzip"}, packed.Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header()["Content-Encoding"] = tc.codings
				w.Write(tc.body)
			}, nil)
			u, key := h.user("standard")
			resp := h.post(key, "/v1/chat/completions", chatBody, nil)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
			if resp.StatusCode != http.StatusOK || string(body) != plainAnswer {
				t.Fatalf("status %d, Content-Encoding %q, body %.120s: want the answer relayed plain", resp.StatusCode,
					resp.Header.Values("Content-Encoding"), body)
			}
			if run.SettleSource.String != "complete" || run.Estimated || run.InTok != 10 || run.OutTok != 5 {
				t.Errorf("run settled %s estimated=%v in=%d out=%d: want complete with the reported 10 in, 5 out",
					run.SettleSource.String, run.Estimated, run.InTok, run.OutTok)
			}
		})
	}
}
