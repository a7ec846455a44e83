package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestUpstreamIsSentJSONWhateverTheCallerLabelled: the body the gateway forwards is JSON (it is
// read, checked and often rewritten as such), and the upstream is told so whatever the caller's
// Content-Type said: `curl -d` labels its body application/x-www-form-urlencoded, and a
// provider that reads the label would refuse the call, or read it as a form.
func TestUpstreamIsSentJSONWhateverTheCallerLabelled(t *testing.T) {
	up, seen := recordingUpstream(nil)
	h := hostileHarness(t, up, nil)
	_, key := h.user("standard")
	for _, label := range []string{"application/x-www-form-urlencoded", "text/plain"} {
		got := postedHeaders(h, key, map[string]string{"Content-Type": label}, seen)
		if v := got.Values("Content-Type"); len(v) != 1 || v[0] != "application/json" {
			t.Errorf("caller's Content-Type %q: the upstream was sent Content-Type %q, want application/json", label, v)
		}
	}
}

// TestUpstreamIsSentItsOwnCredentialsOnly: each upstream is sent the operator's key as its kind
// reads it (OpenAI's Authorization bearer, Anthropic's x-api-key with an anthropic-version,
// the caller's when it sent one: the version chooses the answer's shape), and an upstream with
// no key configured (a model server on the operator's own network) is sent no Authorization at
// all: an empty bearer is a malformed credential a strict server refuses.
func TestUpstreamIsSentItsOwnCredentialsOnly(t *testing.T) {
	const answer = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3}}`
	var mu sync.Mutex
	var got http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(r.URL.Path, "/v1/messages") {
			_, _ = io.WriteString(w, answer)
		} else {
			_, _ = io.WriteString(w, plainAnswer)
		}
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{
			{Name: "keyless", Kind: "openai", BaseURL: up.URL, Models: []string{"fake-gpt"}},
			{Name: "claude", Kind: "anthropic", BaseURL: up.URL, APIKey: "sk-ant-operator", Models: []string{"claude*"}},
		}
	})
	_, key := h.user("standard")
	sent := func(path, body string, hdr map[string]string) http.Header {
		t.Helper()
		h.postOK(t, key, path, body, hdr)
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	if a := sent("/v1/chat/completions", chatBody, nil).Values("Authorization"); len(a) != 0 {
		t.Errorf("an upstream with no key was sent Authorization %q, want none", a)
	}
	const messages = `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct{ callers, want string }{{"", "2023-06-01"}, {"2099-01-01", "2099-01-01"}} {
		hdr := map[string]string{}
		if c.callers != "" {
			hdr["Anthropic-Version"] = c.callers
		}
		g := sent("/v1/messages", messages, hdr)
		if g.Get("X-Api-Key") != "sk-ant-operator" || len(g.Values("Authorization")) != 0 {
			t.Errorf("the Anthropic upstream was sent x-api-key %q and Authorization %q, want the operator's key in x-api-key alone",
				g.Get("X-Api-Key"), g.Values("Authorization"))
		}
		if v := g.Values("Anthropic-Version"); len(v) != 1 || v[0] != c.want {
			t.Errorf("caller's anthropic-version %q: the upstream was sent %q, want %q", c.callers, v, c.want)
		}
	}
}
