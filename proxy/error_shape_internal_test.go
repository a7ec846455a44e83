package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate/tollgate/metering"
)

// errorShapeThrough serves e through shapeErrors at path and returns the answer's status and
// body: error.type and code, and the top-level type ("error" in Anthropic's shape, "" in
// OpenAI's).
func errorShapeThrough(t *testing.T, path string, e *apiError) (status int, top, typ, code string) {
	t.Helper()
	rec := httptest.NewRecorder()
	shapeErrors(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeError(w, e) })).
		ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s %d: not JSON: %s", path, e.Status, rec.Body.Bytes())
	}
	return rec.Code, body.Type, body.Error.Type, body.Error.Code
}

// TestAnthropicErrorTypeFollowsTheStatus: on the Anthropic route, and the paths under it (its
// token counter), an answer the gateway writes names its class as Anthropic's API documents it
// for its status (a 429 rate_limit_error: the Anthropic SDK backs off on it; a 504
// timeout_error), keeping the gateway's code; elsewhere, and on a path that only begins with
// the route's name, the answer keeps OpenAI's shape and type.
func TestAnthropicErrorTypeFollowsTheStatus(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   string
	}{
		{http.StatusBadRequest, "invalid_request_error"},
		{http.StatusUnauthorized, "authentication_error"},
		{http.StatusPaymentRequired, "billing_error"},
		{http.StatusForbidden, "permission_error"},
		{http.StatusNotFound, "not_found_error"},
		{http.StatusConflict, "invalid_request_error"},
		{http.StatusRequestEntityTooLarge, "request_too_large"},
		{http.StatusTooManyRequests, "rate_limit_error"},
		{statusClientClosed, "invalid_request_error"},
		{http.StatusInternalServerError, "api_error"},
		{http.StatusBadGateway, "api_error"},
		{http.StatusServiceUnavailable, "api_error"},
		{http.StatusGatewayTimeout, "timeout_error"},
	} {
		e := &apiError{Status: tc.status, Type: "openai_type", Code: "some_code", Message: "m"}
		for _, path := range []string{anthropicPath, countTokensPath} {
			status, top, typ, code := errorShapeThrough(t, path, e)
			if status != tc.status || top != "error" || typ != tc.want || code != "some_code" {
				t.Errorf("%s, status %d: %d type %q error.type %q code %q, want %d type \"error\" error.type %q code some_code",
					path, tc.status, status, top, typ, code, tc.status, tc.want)
			}
		}
		for _, path := range []string{"/v1/chat/completions", anthropicPath + "x", "/v1/models"} {
			status, top, typ, code := errorShapeThrough(t, path, e)
			if status != tc.status || top != "" || typ != "openai_type" || code != "some_code" {
				t.Errorf("%s, status %d: %d type %q error.type %q code %q, want OpenAI's shape (openai_type)",
					path, tc.status, status, top, typ, code)
			}
		}
	}
}

// TestAnswerClientClosedReturnsWhatItAnswered: a request that ended because its caller left is
// answered 499 client_closed_request and counted 499; one the drain deadline cut is answered
// and counted 503 shutting_down (its caller is still there, and the metrics and log must not
// count the gateway's cut as the caller's leaving); one a newer message of its session
// superseded gets nothing written here (answerSuperseded answers it) and is counted 499.
func TestAnswerClientClosedReturnsWhatItAnswered(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cause      error
		wantStatus int
		wantCode   string
	}{
		{"caller left", context.Canceled, statusClientClosed, "client_closed_request"},
		{"drain deadline", errDrainDeadline, http.StatusServiceUnavailable, "shutting_down"},
		{"superseded", errSuperseded, statusClientClosed, ""},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(tc.cause)
		rec := httptest.NewRecorder()
		got := answerClientClosed(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(ctx))
		if got != tc.wantStatus {
			t.Errorf("%s: returned %d, want %d", tc.name, got, tc.wantStatus)
		}
		if tc.wantCode == "" {
			if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
				t.Errorf("%s: wrote %v %s, want nothing written", tc.name, rec.Header(), rec.Body.Bytes())
			}
			continue
		}
		var body struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.wantStatus || body.Error.Code != tc.wantCode {
			t.Errorf("%s: answered %d %s, want %d %s", tc.name, rec.Code, rec.Body.Bytes(), tc.wantStatus, tc.wantCode)
		}
	}
}

// TestAnswerCallEndedAtTheDrainDeadlineTellsWhatItCharged: a forwarded call the drain deadline
// cut is answered 503 shutting_down either way, but only one charged for what the provider did
// is told it is charged and not to retry; one charged nothing (refused, or before the provider
// had it) is told nothing is charged and keeps its Retry-After, since its retry costs nothing.
func TestAnswerCallEndedAtTheDrainDeadlineTellsWhatItCharged(t *testing.T) {
	for _, tc := range []struct {
		name       string
		o          outcome
		want       *apiError
		noRetry    string
		retryAfter string
	}{
		{"charged", outcomeCancel, errCutAtShutdown, "false", ""},
		{"charged nothing", outcomeRefused, errCutUncharged, "", "1"},
	} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errDrainDeadline)
		rec := httptest.NewRecorder()
		c := &call{outcome: tc.o, meter: metering.NewMeter(metering.FormatChat)}
		got := answerCallEnded(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(ctx), c)
		var body struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || got != http.StatusServiceUnavailable ||
			rec.Code != http.StatusServiceUnavailable || body.Error.Code != "shutting_down" || body.Error.Message != tc.want.Message {
			t.Errorf("%s: returned %d, answered %d %s, want 503 shutting_down %q", tc.name, got, rec.Code, rec.Body.Bytes(), tc.want.Message)
		}
		if h := rec.Header(); h.Get(shouldRetryHeader) != tc.noRetry || h.Get("Retry-After") != tc.retryAfter {
			t.Errorf("%s: %s %q, Retry-After %q, want %q and %q", tc.name, shouldRetryHeader, h.Get(shouldRetryHeader),
				h.Get("Retry-After"), tc.noRetry, tc.retryAfter)
		}
	}
}
