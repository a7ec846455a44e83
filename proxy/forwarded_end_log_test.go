package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// TestForwardedCallEndedBeforeItsAnswerIsLogged: a call forwarded upstream whose request ends
// before the upstream's answer began — its caller leaves (499 client_closed_request), or the
// drain deadline cuts it (503 shutting_down) — is answered, and settled, like a call refused
// before forwarding, and writes its line as such a call does: the code and status it was
// answered, and its run. It wrote none, so the caller's 499 or 503 (and the charge of its
// prompt's estimate) could not be traced to its run in the log.
func TestForwardedCallEndedBeforeItsAnswerIsLogged(t *testing.T) {
	for _, tc := range []struct {
		name, code string
		status     int
		told       string // in the message the caller is told and the line says
		end        func(h *harness, leave context.CancelFunc)
	}{
		{"caller left", "client_closed_request", 499, "closed the request", func(_ *harness, leave context.CancelFunc) { leave() }},
		// Charged its prompt's estimate, and told so: not that nothing is charged.
		{"cut at the drain deadline", "shutting_down", http.StatusServiceUnavailable, "charged what it used",
			func(h *harness, _ context.CancelFunc) { h.srv.CutCalls() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, gate, logs := gatedObservedHarness(t, config.Upstream{Name: "gate-openai", Kind: "openai", Models: []string{"*"}})
			u, key := h.user("standard")
			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.gw.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("X-Test-Gate", "wait")
			runID := make(chan string, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					runID <- ""
					return
				}
				resp.Body.Close()
				runID <- resp.Header.Get("X-Tollgate-Run-Id")
			}()
			gate.await(t, "wait", 1)
			tc.end(h, leave)
			<-runID
			series := `tollgate_requests_total{code="` + map[int]string{499: "499", 503: "503"}[tc.status] + `",route="/v1/chat/completions"}`
			waitFor(t, "the call's end to be counted", func() bool { return h.metric(series) == "1" })
			h.settled()
			var run string
			if err := h.db.Get(&run, "SELECT run_id FROM run_holds WHERE user_id = ?", u.ID); err != nil {
				t.Fatal(err)
			}
			for _, l := range logs.All() {
				f := l.ContextMap()
				if f["code"] == tc.code && f["status"] == int64(tc.status) && f["run_id"] == run {
					if msg, _ := f["message"].(string); !strings.Contains(msg, tc.told) {
						t.Errorf("the forwarded call's line says it was told %q; want %q in it", msg, tc.told)
					}
					return
				}
			}
			t.Fatalf("no line with code %s, status %d and run %s for the forwarded call", tc.code, tc.status, run)
		})
	}
}
