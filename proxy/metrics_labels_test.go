package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestRequestCodeLabelIsBounded: tollgate_requests_total's code is the status the caller got,
// which for an upstream's 2xx answers and its 4xx refusals is the upstream's own status. A
// status net/http does not know is counted under its class (2xx, 4xx): an upstream that makes
// up a status per answer must not make up a series per status.
func TestRequestCodeLabelIsBounded(t *testing.T) {
	h := hostileHarness(t, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.Header.Get("X-Want-Status"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if code >= 400 {
			_, _ = w.Write([]byte(`{"error":{"message":"no","type":"invalid_request_error","code":"made_up"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`))
	}, nil)
	_, key := h.user("standard")
	codes := []int{http.StatusOK, http.StatusTooManyRequests}
	for i := range 5 {
		codes = append(codes, 230+i, 460+i)
	}
	for _, code := range codes {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Want-Status": strconv.Itoa(code)})
		readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != code {
			t.Fatalf("upstream status %d reached the caller as %d", code, resp.StatusCode)
		}
	}
	h.settled()
	const route = `route="/v1/chat/completions"`
	want := map[string]string{"200": "1", "429": "1", "2xx": "5", "4xx": "5"}
	for code, n := range want {
		if got := h.metric(`tollgate_requests_total{code="` + code + `",` + route + `}`); got != n {
			t.Errorf("requests with code %s: %q, want %s", code, got, n)
		}
	}
	resp, err := http.Get(h.gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	series := 0
	for _, line := range strings.Split(string(readAll(t, resp.Body)), "\n") {
		if strings.HasPrefix(line, "tollgate_requests_total{") && strings.Contains(line, route) {
			series++
		}
	}
	if series != len(want) {
		t.Errorf("%d series of tollgate_requests_total for the route, want %d", series, len(want))
	}
}
