package proxy_test

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestStreamEndedByTheProvidersErrorIsLogged: a stream the provider ends with its own error
// event — after output (settled stream_error, charged) or before any (upstream_error, at 0) —
// wrote no line at INFO or above, while a whole answer carrying an error object writes a WARN,
// and so does a stream that breaks without a word: an operator who found stream_error rows, or
// a provider failing every stream mid-way, had nothing in the log to say why. It writes one
// WARN line now, naming the call's run, the upstream and the error the provider sent, on
// each wire format.
func TestStreamEndedByTheProvidersErrorIsLogged(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	anth := map[string]string{"anthropic-version": "2023-06-01"}
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		after            string
		source           string
	}{
		{"chat after output", "/v1/chat/completions", streamBody, nil, "2", holds.SourceStreamError},
		{"chat before output", "/v1/chat/completions", streamBody, nil, "0", holds.SourceUpstreamError},
		{"messages after output", "/v1/messages", `{"model":"claude-test","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			anth, "2", holds.SourceStreamError},
		{"responses after output", "/v1/responses", `{"model":"fake-gpt","stream":true,"input":"hi"}`, nil, "2", holds.SourceStreamError},
	} {
		h.settled()
		logs.TakeAll()
		hdr := map[string]string{fakellm.HeaderErrorAfter: tc.after}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		resp := h.post(key, tc.path, tc.body, hdr)
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get(proxy.RunIDHeader)
		h.settled()
		if r := h.run(u.ID, runID); r.SettleSource.String != tc.source {
			t.Fatalf("%s: settled %s, want %s", tc.name, r.SettleSource.String, tc.source)
		}
		lines := logs.TakeAll()
		var found []observer.LoggedEntry
		for _, l := range lines {
			if l.Level >= zapcore.InfoLevel {
				found = append(found, l)
			}
		}
		if len(found) != 1 || found[0].Level != zapcore.WarnLevel {
			var msgs []string
			for _, l := range lines {
				msgs = append(msgs, l.Level.String()+" "+l.Message)
			}
			t.Errorf("%s: lines %q, want one WARN saying the provider ended the stream with an error", tc.name, msgs)
			continue
		}
		f := found[0].ContextMap()
		if f["run_id"] != runID || f["upstream"] == nil || f["error_message"] != "fake upstream error" {
			t.Errorf("%s: logged %q %v, want the run %s, its upstream and the provider's error message", tc.name, found[0].Message, f, runID)
		}
	}
}
