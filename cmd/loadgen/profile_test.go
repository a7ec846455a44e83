package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A results file lists its profiles relative to its own directory: results are committed, and
// the absolute path of the machine that ran them (as three earlier files of bench/results had) names
// nothing on another. A profile written outside that directory keeps the path it was given.
func TestProfilesAreNamedRelativeToTheResultsFile(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("cpu")) })
	mux.HandleFunc("/debug/pprof/allocs", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("allocs")) })
	srv := httptest.NewServer(mux)
	defer srv.Close()

	out := t.TempDir()
	r := &runner{pprof: srv.URL, outDir: out, profDir: filepath.Join(out, "profiles-x")}
	got := r.profile("latency-1conn", 1)
	want := []string{"profiles-x/latency-1conn.allocs.pprof", "profiles-x/latency-1conn.cpu.pprof"}
	if !slices.Equal(got, want) {
		t.Fatalf("profiles listed as %q, want %q", got, want)
	}
	for i, body := range []string{"allocs", "cpu"} {
		b, err := os.ReadFile(filepath.Join(out, got[i]))
		if err != nil || string(b) != body {
			t.Errorf("%s: %q, %v; want %q", got[i], b, err, body)
		}
	}

	elsewhere := filepath.Join(t.TempDir(), "profiles")
	r.profDir = elsewhere
	got = r.profile("hot-64", 1)
	want = []string{filepath.Join(elsewhere, "hot-64.allocs.pprof"), filepath.Join(elsewhere, "hot-64.cpu.pprof")}
	if !slices.Equal(got, want) {
		t.Errorf("profiles outside the results directory listed as %q, want %q", got, want)
	}
}
