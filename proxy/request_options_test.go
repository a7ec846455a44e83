package proxy_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestMalformedStreamOptionsIsRefusedBeforeAnything: a stream_options that is not an object
// is a malformed request; it must be refused by validation (DESIGN §3.2: nothing is held for
// a refused request), not after a hold and a session claim that has already stopped the
// session's running call.
func TestMalformedStreamOptionsIsRefusedBeforeAnything(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	// A session's first message, streaming slowly.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"first"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(proxy.SessionHeader, "s1")
	req.Header.Set(fakellm.HeaderChunks, "400")
	req.Header.Set(fakellm.HeaderChunkInterval, "5ms")
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	firstRun := first.Header.Get(proxy.RunIDHeader)
	rd := bufio.NewReader(first.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// A malformed next message of the session.
	resp := h.post(key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"stream_options":[true],"messages":[{"role":"user","content":"second"}]}`,
		map[string]string{proxy.SessionHeader: "s1"})
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	errorCode(t, body)
	rest := readAll(t, rd)
	r := h.run(u.ID, firstRun)
	if strings.Contains(string(rest), "superseded") || r.SettleSource.String != holds.SourceComplete {
		t.Errorf("a refused request stopped the session's running call: settled as %q", r.SettleSource.String)
	}
	if all, _ := h.holdCount(); all != 1 {
		t.Errorf("%d holds for one call and one refused request", all)
	}
}
