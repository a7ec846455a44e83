package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
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

// TestAllowedMethodsNamesHEADWithGET: a route served on GET answers HEAD as well (chi's
// GetHead), so a 405's Allow names it; a route served on no method gets an empty list, which
// the proxy answers 404.
func TestAllowedMethodsNamesHEADWithGET(t *testing.T) {
	served := map[string]bool{http.MethodGet: true, http.MethodPatch: true}
	got := httpapi.AllowedMethods(func(m string) bool { return served[m] })
	if want := []string{http.MethodGet, http.MethodHead, http.MethodPatch}; !slices.Equal(got, want) {
		t.Errorf("AllowedMethods = %v; want %v", got, want)
	}
	if got := httpapi.AllowedMethods(func(string) bool { return false }); len(got) != 0 {
		t.Errorf("AllowedMethods of nothing served = %v; want none", got)
	}
}
