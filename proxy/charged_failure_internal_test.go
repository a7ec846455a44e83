package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/metering"
)

// TestChargedFollowsWhatTheSettlementCharges: a failed call is told not to be retried exactly
// when it is charged for what the provider did (charged, read before the answer goes out, as
// settlementAs decides later). One released or settled at 0 — refused, a duplicate, an upstream
// that failed before producing anything (its request unreachable, or its error object before
// any work) — keeps the advice, since the SDK's retry costs nothing more; one charged — cut by
// its caller, timed out with the prompt taken, broken after producing — is told not to retry.
func TestChargedFollowsWhatTheSettlementCharges(t *testing.T) {
	meter := func(body string) *metering.Meter {
		m := metering.NewMeter(metering.FormatChat)
		if body != "" {
			m.Body([]byte(body))
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		o       outcome
		body    string
		charged bool
	}{
		{"refused", outcomeRefused, "", false},
		{"duplicate", outcomeDuplicate, "", false},
		{"upstream error", outcomeUpstreamError, "", false},
		{"complete", outcomeComplete, "", true},
		{"cancel", outcomeCancel, "", true},
		{"upstream timeout", outcomeUpstreamTimeout, "", true},
		{"broken, nothing reported", outcomeStreamError, "", true},
		{"broken after producing", outcomeStreamError, `{"choices":[{"index":0,"message":{"content":"half an answer"}}]}`, true},
		{"error object before any work", outcomeStreamError, `{"error":{"message":"overloaded","type":"server_error"}}`, false},
	} {
		c := &call{outcome: tc.o, meter: meter(tc.body)}
		if got := c.charged(); got != tc.charged {
			t.Errorf("%s: charged() = %v, want %v", tc.name, got, tc.charged)
		}
	}
}

// TestWriteCallErrorTellsAChargedCallNotToRetry: a failure its caller is charged for is
// answered X-Should-Retry: false and without its Retry-After (the SDKs resend a 5xx, each resend
// charged again); one charged nothing keeps its Retry-After and no such header. The shared
// error value is not changed for the calls that follow.
func TestWriteCallErrorTellsAChargedCallNotToRetry(t *testing.T) {
	e := &apiError{Status: http.StatusServiceUnavailable, Type: "api_error", Code: "server_busy", Message: "busy", RetryAfter: 2 * time.Second}
	charged := httptest.NewRecorder()
	writeCallError(charged, &call{outcome: outcomeComplete, meter: metering.NewMeter(metering.FormatChat)}, e)
	if got := charged.Header().Get(shouldRetryHeader); got != "false" {
		t.Errorf("charged call: %s %q, want false", shouldRetryHeader, got)
	}
	if got := charged.Header().Get("Retry-After"); got != "" {
		t.Errorf("charged call: Retry-After %q, want none", got)
	}
	if charged.Code != e.Status {
		t.Errorf("charged call: status %d, want %d", charged.Code, e.Status)
	}
	free := httptest.NewRecorder()
	writeCallError(free, &call{outcome: outcomeUpstreamError, meter: metering.NewMeter(metering.FormatChat)}, e)
	if got := free.Header().Get(shouldRetryHeader); got != "" {
		t.Errorf("call charged nothing: %s %q, want none", shouldRetryHeader, got)
	}
	if got := free.Header().Get("Retry-After"); got != "2" {
		t.Errorf("call charged nothing: Retry-After %q, want 2", got)
	}
	if e.NoRetry || e.RetryAfter != 2*time.Second {
		t.Errorf("writeCallError changed the error it was given: %+v", e)
	}
}
