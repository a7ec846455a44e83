package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestOneUsersNamesAreNotAnothers: every name a caller chooses — an Idempotency-Key, an
// X-Session-Id, an X-Run-Id, and the body the fingerprint window compares — is scoped to its
// user. Another user choosing the same name gets neither the first user's stored answer (its
// prompt's answer, to a stranger), nor a 422 or 409 that says the name is taken and by which run,
// nor the power to supersede or settle the first user's call; each runs its own.
func TestOneUsersNamesAreNotAnothers(t *testing.T) {
	h := newHarness(t, nil)
	_, keyA := h.user("standard")
	_, keyB := h.user("standard")

	// Idempotency-Key: A's answer is stored under it; B's request under the same key, with the
	// same body and then with another, runs as a new one.
	idem := map[string]string{"Idempotency-Key": "shared-key-1"}
	a := sendOK(t, "A under the key", h.gw.URL, keyA, chatBody, idem)
	calls := h.fake.Calls()
	b := send(h.gw.URL, keyB, chatBody, idem)
	if b.status != 200 || b.header.Get(proxy.ReplayedHeader) != "" || h.fake.Calls() != calls+1 {
		t.Fatalf("B under A's key, same body: %d replayed=%q upstream calls %d→%d %s; want a run of its own",
			b.status, b.header.Get(proxy.ReplayedHeader), calls, h.fake.Calls(), b.body)
	}
	if b.header.Get(proxy.RunIDHeader) == a.header.Get(proxy.RunIDHeader) && a.header.Get(proxy.RunIDHeader) != "" {
		t.Fatalf("B's call under A's key was given A's run %s", a.header.Get(proxy.RunIDHeader))
	}
	other := strings.Replace(chatBody, "hello", "goodbye", 1)
	sendOK(t, "B's own key-2", h.gw.URL, keyB, other, map[string]string{"Idempotency-Key": "shared-key-2"})
	if c := send(h.gw.URL, keyA, chatBody, map[string]string{"Idempotency-Key": "shared-key-2"}); c.status != 200 || c.header.Get(proxy.ReplayedHeader) != "" {
		t.Fatalf("A under B's key-2 with another body: %d replayed=%q %s; want a run of its own, not 422",
			c.status, c.header.Get(proxy.ReplayedHeader), c.body)
	}

	// The fingerprint window: the same body from two users at once is two requests.
	fp := strings.Replace(chatBody, "hello", "hello twice", 1)
	sendOK(t, "A's body", h.gw.URL, keyA, fp, nil)
	if c := send(h.gw.URL, keyB, fp, nil); c.status != 200 {
		t.Fatalf("B's same body within the window: %d %s; want it run, not a duplicate of A's", c.status, c.body)
	}

	// X-Session-Id: B's new message under A's session id neither supersedes A's running call
	// nor is refused as already running.
	req := h.newRequest(keyA, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"a long story"}]}`,
		map[string]string{"X-Session-Id": "tab-1", fakellm.HeaderChunks: "200", fakellm.HeaderChunkInterval: "5ms"})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := afterContent(t, resp, 2)
	for _, body := range []string{chatBody, `{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"a long story"}]}`} {
		sendOK(t, "B under A's session id", h.gw.URL, keyB, body, map[string]string{"X-Session-Id": "tab-1"})
	}
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rest), "superseded") || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("A's stream under its session, after B used the same id: …%s", rest[max(0, len(rest)-300):])
	}

	// X-Run-Id: the same name is two runs; B's settle and B's view are of B's run alone.
	run := map[string]string{"X-Run-Id": "agent-1"}
	ra := send(h.gw.URL, keyA, chatBody, run)
	rb := send(h.gw.URL, keyB, strings.Replace(chatBody, "hello", "hi", 1), run)
	if ra.status != 200 || rb.status != 200 {
		t.Fatalf("named runs: A %d %s, B %d %s", ra.status, ra.body, rb.status, rb.body)
	}
	if st, body := h.settleRun(keyB, "agent-1"); st != 200 {
		t.Fatalf("B's settle of its agent-1: %d %s", st, body)
	}
	if c := send(h.gw.URL, keyA, chatBody, run); c.status != 200 {
		t.Fatalf("A's agent-1 after B settled its own: %d %s; want it still open", c.status, c.body)
	}
	view := func(key string) map[string]any {
		st, v := h.get(key, "/v1/runs/agent-1")
		if st != 200 {
			t.Fatalf("GET agent-1: %d %v", st, v)
		}
		return v
	}
	va, vb := view(keyA), view(keyB)
	if va["state"] == vb["state"] {
		t.Fatalf("A's and B's agent-1 read the same state %v: %v / %v", va["state"], va, vb)
	}
	if st, body := h.settleRun(keyA, "agent-1"); st != 200 {
		t.Fatalf("A's settle of its agent-1: %d %s", st, body)
	}
}
