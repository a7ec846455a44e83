package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// stallingAnswer is an upstream that took the whole request, sends the headers and the first
// bytes of a non-streamed answer, says so on sent, then stalls until its request ends.
func stallingAnswer(t *testing.T) (url string, sent <-chan struct{}) {
	ch := make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"id":"c1","object":"chat.completion","model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"hi`))
		w.(http.Flusher).Flush()
		select {
		case ch <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	return ts.URL, ch
}

// TestCallerLeavingWhileTheAnswerIsReadIsChargedAsACancel: the provider has the prompt and is
// sending its (non-streamed) answer when the caller leaves: settled as a cancel, at the
// prompt's estimate (answerBodyFailure), not at 0 as an upstream failure.
func TestCallerLeavingWhileTheAnswerIsReadIsChargedAsACancel(t *testing.T) {
	up, sent := stallingAnswer(t)
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up })
	u, key := h.user("standard")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-sent
	cancel()
	<-done
	h.settled()
	var runID string
	if err := h.db.Get(&runID, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	r := h.run(u.ID, runID)
	if r.SettleSource.String != holds.SourceCancel || !r.Estimated || r.InTok == 0 || r.ChargedMicro == 0 {
		t.Fatalf("run = %+v, want settled by cancel at the prompt's estimate", r)
	}
}

// TestAnswerTimingOutWhileReadIsChargedItsPrompt: as TestUpstreamTimeoutAfterTheRequestIsChargedItsPrompt,
// for an answer whose headers came and whose body stalled past upstream_timeout.
func TestAnswerTimingOutWhileReadIsChargedItsPrompt(t *testing.T) {
	up, _ := stallingAnswer(t)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up
		c.Limits.UpstreamTimeout = time.Second
	})
	u, key := h.user("standard")
	resp := h.post(key, "/v1/chat/completions", chatBody, nil)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || errorCode(t, body) != "upstream_timeout" {
		t.Fatalf("status %d body %s, want 504 upstream_timeout", resp.StatusCode, body)
	}
	r := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader))
	if r.SettleSource.String != holds.SourceUpstreamTimeout || !r.Estimated || r.InTok == 0 || r.ChargedMicro == 0 {
		t.Fatalf("run = %+v, want the prompt's estimate charged as upstream_timeout", r)
	}
}
