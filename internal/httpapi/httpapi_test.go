package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi"
)

func TestBearerCredentials(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"Bearer k", "k", true},
		{"bearer k", "k", true},
		{"BEARER  k ", "k", true},
		{"Bearer ", "", false},
		{"Bearer   ", "", false},
		{"Bearer", "", false},
		{"Basic k", "", false},
		{"", "", false},
	} {
		got, ok := httpapi.BearerCredentials(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("BearerCredentials(%q) = %q, %t; want %q, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSetRetryAfterRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", 5 * time.Second: "5"} {
		h := http.Header{}
		httpapi.SetRetryAfter(h, d)
		if got := h.Get("Retry-After"); got != want {
			t.Errorf("SetRetryAfter(%v) = %q; want %q", d, got, want)
		}
	}
}

func TestWriteJSONError(t *testing.T) {
	rec := httptest.NewRecorder()
	httpapi.WriteJSON(rec, http.StatusConflict, map[string]any{"error": httpapi.ErrorBody("m", "t", "c")})
	if rec.Code != http.StatusConflict || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if got, want := rec.Body.String(), `{"error":{"code":"c","message":"m","type":"t"}}`+"\n"; got != want {
		t.Fatalf("body %q; want %q", got, want)
	}
}
