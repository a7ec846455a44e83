package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"
)

// TestUsageReportsAreBoundedAtOnce: a usage report of a long range allocates a few hundred MB
// (a map a row, the body encoded whole) in the gateway's own process, beside the calls it
// meters; nothing bounded how many ran at once. With every slot taken, another report is
// refused 429 with a retry hint before it reads anything (a nil store would panic on a read).
func TestUsageReportsAreBoundedAtOnce(t *testing.T) {
	h := &handler{log: zap.NewNop(), reports: make(chan struct{}, maxReportsAtOnce)}
	for range maxReportsAtOnce {
		h.reports <- struct{}{}
	}
	w := httptest.NewRecorder()
	h.usageReport(w, httptest.NewRequest(http.MethodGet, "/reports/usage?from=2026-01-01&to=2026-11-30", nil))
	// README "Operating it": a third report gets 429 reports_busy with Retry-After: 5, in the
	// admin API's (OpenAI's) error shape.
	var answer struct {
		Error struct{ Code, Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
		t.Fatalf("a report past the bound: %s is not an error answer: %v", w.Body, err)
	}
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "5" || answer.Error.Code != "reports_busy" ||
		answer.Error.Type != "rate_limit_error" || answer.Error.Message == "" {
		t.Fatalf("a report past the bound: %d (Retry-After %q) %s, want 429 reports_busy with Retry-After: 5", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
}
