package admin

import (
	"net/http"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi"
)

// apiError is an answer in OpenAI's error shape, {"error":{"message","type","code"}}, the
// same as the proxy's (httpapi.ErrorBody), so one client library reads both. It is not an error value: handlers
// return it beside their errors, so a nil *apiError can never become a non-nil error.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Message string
	// RetryAfter, when set, is sent as Retry-After (whole seconds).
	RetryAfter time.Duration
}

func badRequest(code, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
}

var (
	errDisabled = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "admin_disabled",
		Message: "The admin API is disabled: no admin_token is configured."}
	errBadToken = &apiError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_admin_token",
		Message: "Invalid or missing admin token. Send it as 'Authorization: Bearer <admin token>'."}
	errNoRoute = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: "No such admin route."}
	errMethod = &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "Method not allowed on this route."}
	errUserNotFound = &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "user_not_found",
		Message: "No such user."}
)

// writeError sends e, and counts it where the gateway counts its error answers
// (httpapi.CountError: tollgate_error_answers_total when the API is mounted in the gateway).
func writeError(w http.ResponseWriter, e *apiError) {
	httpapi.CountError(w, e.Status, e.Code)
	if e.RetryAfter > 0 {
		httpapi.SetRetryAfter(w.Header(), e.RetryAfter)
	}
	httpapi.WriteJSON(w, e.Status, map[string]any{"error": httpapi.ErrorBody(e.Message, e.Type, e.Code)})
}
