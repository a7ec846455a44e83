package proxy_test

import (
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// TestIDHeaderSentTwiceIsRefused: the gateway's own headers name a call's run, its retries or
// its conversation; sent on more than one line, a name was read as its first, perhaps empty.
// A retry whose first Idempotency-Key line was empty ran as a plain call and was charged
// again, and a session message with an empty first X-Session-Id line replaced nothing. Each is
// refused 400 with its header's code, nothing held or forwarded.
func TestIDHeaderSentTwiceIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	for _, tc := range []struct{ header, code string }{
		{proxy.IdempotencyKeyHeader, "invalid_idempotency_key"},
		{proxy.SessionHeader, "invalid_session_id"},
		{"X-Run-Id", "invalid_run_id"},
	} {
		for _, lines := range [][]string{{"", "k-1"}, {"k-1", "k-2"}, {"k-1", "k-1"}} {
			t.Run(tc.header, func(t *testing.T) {
				refusedOnLines(t, h, key, "/v1/chat/completions", chatBody, tc.header, lines, tc.code)
			})
		}
	}
	// Sent once it is served as before.
	if run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, map[string]string{proxy.IdempotencyKeyHeader: "k-once"}); run.RunID == "" {
		t.Error("a call with one Idempotency-Key line was not answered")
	}
}

// TestCredentialsSentTwiceAreRefused: a key header is single-valued (RFC 9110 §5.3 lets only a
// list-valued field repeat), and the gateway read the first of two Authorization lines: a
// caller whose first line was empty was refused 401 as keyless, and one whose proxy added a
// line before the caller's own was charged to the proxy's key. Two Authorization lines on any
// route, or two x-api-key lines on a route that reads it, are refused 400
// invalid_authorization before the key is looked up: nothing held, nothing forwarded.
func TestCredentialsSentTwiceAreRefused(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	_, other := h.user("standard")
	msg := `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		path, body, header string
		lines              []string
	}{
		{"/v1/chat/completions", chatBody, "Authorization", []string{"Bearer " + key, "Bearer " + other}},
		{"/v1/chat/completions", chatBody, "Authorization", []string{"", "Bearer " + key}},
		{"/v1/chat/completions", chatBody, "Authorization", []string{"Bearer " + key, "Bearer " + key}},
		{"/v1/messages", msg, "Authorization", []string{"Bearer " + key, "Bearer " + other}},
		{"/v1/messages", msg, "X-Api-Key", []string{key, other}},
		{"/v1/messages", msg, "X-Api-Key", []string{"", key}},
	} {
		t.Run(tc.path+" "+tc.header, func(t *testing.T) {
			refusedOnLines(t, h, "", tc.path, tc.body, tc.header, tc.lines, "invalid_authorization")
		})
	}
	// A GET the key authenticates is refused alike.
	req, err := http.NewRequest(http.MethodGet, h.gw.URL+"/v1/credits", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Add("Authorization", "Bearer "+other)
	req.Header.Add("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, out) != "invalid_authorization" {
		t.Errorf("GET /v1/credits with two Authorization lines: %d %s, want 400 invalid_authorization", resp.StatusCode, out)
	}
	// Sent once, in either header, the key is served as before; an x-api-key line beside one
	// Authorization line is not a repeat (the Bearer key is read).
	if run, _ := h.answeredRun(u.ID, key, "/v1/chat/completions", chatBody, nil); run.RunID == "" {
		t.Error("a call with one Authorization line was not answered")
	}
	resp = h.post(key, "/v1/messages", msg, map[string]string{"X-Api-Key": other})
	out = readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/v1/messages with one Authorization and one x-api-key line: %d %s, want 200", resp.StatusCode, out)
	}
}

// refusedOnLines sends a call with header on the given lines (and key, unless ""), and fails
// unless it is refused 400 code before anything is held or forwarded.
func refusedOnLines(t *testing.T, h *harness, key, path, body, header string, lines []string, code string) {
	t.Helper()
	holdsBefore, _ := h.holdCount()
	calls := h.fake.Calls()
	req := h.newRequest(key, path, body, nil)
	for _, v := range lines {
		req.Header.Add(header, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, out) != code {
		t.Errorf("%s sent as %q: %d %s, want 400 %s", header, lines, resp.StatusCode, out, code)
	}
	if holdsAfter, _ := h.holdCount(); h.fake.Calls() != calls || holdsAfter != holdsBefore {
		t.Errorf("%s sent as %q reached the upstream (%d → %d calls) or took a hold (%d → %d holds)",
			header, lines, calls, h.fake.Calls(), holdsBefore, holdsAfter)
	}
}
