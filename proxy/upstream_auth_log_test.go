package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/internal/fakellm"
)

// TestUpstreamRefusingTheGatewaysKeyLogsWhatToCheck: a provider's 401/403 refuses the
// gateway's own key, so every call to it fails until the operator fixes the key. Its line said
// "upstream refused the call", the words of a caller's 400, and under them the operator found
// nothing to do; it names the key to check, with the call's run and user.
func TestUpstreamRefusingTheGatewaysKeyLogsWhatToCheck(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	u, key := h.user("standard")
	for _, status := range []int{401, 403} {
		resp := h.post(key, "/v1/chat/completions", chatBody, map[string]string{fakellm.HeaderStatus: fmt.Sprint(status)})
		readAll(t, resp.Body)
		resp.Body.Close()
		runID := resp.Header.Get("X-Tollgate-Run-Id")
		var line *observer.LoggedEntry
		for _, e := range logs.TakeAll() {
			if strings.Contains(e.Message, "upstream") {
				line = &e
			}
		}
		if line == nil {
			t.Fatalf("upstream %d: no upstream line", status)
		}
		if !strings.Contains(line.Message, "credentials") || !strings.Contains(line.Message, "API key") {
			t.Errorf("upstream %d: line %q does not say the gateway's key was refused, nor what to check", status, line.Message)
		}
		ctx := line.ContextMap()
		if ctx["run_id"] != runID || ctx["user_id"] != u.ID || ctx["status"] != int64(status) {
			t.Errorf("upstream %d: fields %v, want run_id %s, user_id %d, status %d", status, ctx, runID, u.ID, status)
		}
	}
}
