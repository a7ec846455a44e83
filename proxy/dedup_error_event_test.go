package proxy_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestSameRequestSentOnTheProvidersErrorEventIsNotADuplicate: the provider's own error event
// ends the answer for its caller, as a final event does (the SDKs raise on it). What the call
// claimed against duplicates is given back before that event goes out: the same request sent
// the moment the caller has it is a new call, not a 409 duplicate of one whose upstream has
// not closed yet (it lingers here, until the gateway cuts it).
func TestSameRequestSentOnTheProvidersErrorEventIsNotADuplicate(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	hdr := map[string]string{fakellm.HeaderChunks: "5", fakellm.HeaderErrorAfter: "2", fakellm.HeaderLinger: "10s"}
	first := h.post(key, "/v1/chat/completions", streamBody, hdr)
	defer first.Body.Close()
	br := bufio.NewReader(first.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the provider's error event: %v", err)
		}
		if strings.Contains(line, "fake upstream error") {
			break
		}
	}
	again := send(h.gw.URL, key, streamBody, hdr)
	if again.err != nil || again.status != http.StatusOK {
		t.Fatalf("the same request sent once the caller had the error event: %d %v %s, want 200 (a new call)",
			again.status, again.err, again.body)
	}
}
