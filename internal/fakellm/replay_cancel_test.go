package fakellm_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/fixtures"
)

// writeRecorder records each run of bytes between flushes, which is what a
// split must produce: one flushed write per segment.
type writeRecorder struct {
	header  http.Header
	status  int
	pending []byte
	writes  [][]byte
}

func (w *writeRecorder) Header() http.Header  { return w.header }
func (w *writeRecorder) WriteHeader(code int) { w.status = code }
func (w *writeRecorder) Write(p []byte) (int, error) {
	w.pending = append(w.pending, p...)
	return len(p), nil
}
func (w *writeRecorder) Flush() {
	if len(w.pending) > 0 {
		w.writes = append(w.writes, w.pending)
		w.pending = nil
	}
}

func fixtureDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const recorded = "data: {\"choices\":[{\"delta\":{\"content\":\"h\u00e9llo \u2014 w\u00f6rld\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":14,\"completion_tokens\":13,\"total_tokens\":27}}\n\n" +
	"data: [DONE]\n\n"

func TestReplaySplits(t *testing.T) {
	dir := fixtureDir(t, map[string]string{"rec.sse": recorded, "body.json": `{"usage":{"prompt_tokens":1}}`})
	s := fakellm.New(fakellm.Config{FixturesDir: dir})

	// Offsets unordered, repeated, and one past the end: sorted, merged, dropped.
	// 41 falls inside the two bytes of "é".
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"ignored":true}`))
	req.Header.Set(fakellm.HeaderReplay, "rec.sse")
	req.Header.Set(fakellm.HeaderSplit, "41, 5,1,41,99999")
	rec := &writeRecorder{header: http.Header{}}
	s.ServeHTTP(rec, req)
	rec.Flush()
	want := []string{recorded[:1], recorded[1:5], recorded[5:41], recorded[41:]}
	if rec.status != 200 || rec.header.Get("Content-Type") != "text/event-stream" || len(rec.writes) != len(want) {
		t.Fatalf("status %d, type %q, %d writes", rec.status, rec.header.Get("Content-Type"), len(rec.writes))
	}
	for i, w := range want {
		if string(rec.writes[i]) != w {
			t.Errorf("write %d = %q, want %q", i, rec.writes[i], w)
		}
	}

	// Over HTTP the bytes arrive intact, paced, with the route's body ignored.
	ts := start(t, s)
	resp := call(t, ts, "/v1/chat/completions", `not even json`, fakellm.HeaderReplay, "rec.sse",
		fakellm.HeaderSplit, "3,50,100", fakellm.HeaderChunkInterval, "1ms")
	if got := readAll(t, resp); got != recorded {
		t.Errorf("replay over HTTP:\n%q\nwant\n%q", got, recorded)
	}
	resp = call(t, ts, "/v1/messages", `{}`, fakellm.HeaderReplay, "body.json")
	if got := readAll(t, resp); got != `{"usage":{"prompt_tokens":1}}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("json replay: %q %q", got, resp.Header.Get("Content-Type"))
	}

	// Dropped after two writes: the client has the first two segments only.
	resp = call(t, ts, "/v1/chat/completions", `{}`, fakellm.HeaderReplay, "rec.sse",
		fakellm.HeaderSplit, "10,20", fakellm.HeaderDropAfter, "2")
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(got) != recorded[:20] {
		t.Errorf("drop during replay: %v, got %q", err, got)
	}
	if s.Calls() != 4 {
		t.Errorf("Calls = %d, want 4", s.Calls())
	}
}

// The recorded provider responses of the project replay byte for byte.
func TestReplayRecordedFixtures(t *testing.T) {
	dir := fixtures.Dir(t)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, fakellm.New(fakellm.Config{FixturesDir: dir}))
	n := 0
	for _, e := range entries {
		name := e.Name()
		if name == "expected.json" || (!strings.HasSuffix(name, ".sse") && !strings.HasSuffix(name, ".json")) {
			continue // expected.json is the fixtures' answers, not a recorded response
		}
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, call(t, ts, "/v1/chat/completions", `{}`, fakellm.HeaderReplay, name, fakellm.HeaderSplit, "1,7,100,101,1000"))
		if got != string(want) {
			t.Errorf("%s: replay differs", name)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no recorded response in %s", dir)
	}
}

func TestReplayRejectsEscapes(t *testing.T) {
	parent := t.TempDir()
	secret := filepath.Join(parent, "secret.sse")
	if err := os.WriteFile(secret, []byte("SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "fixtures")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "x.sse"), []byte("SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "link.sse")); err != nil {
		t.Fatal(err)
	}
	ts := start(t, fakellm.New(fakellm.Config{FixturesDir: dir}))
	for _, name := range []string{"../secret.sse", "..", ".", "sub/x.sse", `..\secret.sse`, secret, "link.sse", "sub"} {
		resp := call(t, ts, "/v1/chat/completions", `{}`, fakellm.HeaderReplay, name)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "SECRET") {
			t.Errorf("%q: %d %s", name, resp.StatusCode, body)
		}
	}
	resp := call(t, ts, "/v1/chat/completions", `{}`, fakellm.HeaderReplay, "missing.sse")
	if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound {
		t.Errorf("missing fixture: %d %s", resp.StatusCode, body)
	}
}

// A client that leaves must free the handler wherever it is waiting. The test
// waits for the handler to return, not for a fixed time: the guard only turns
// a hang into a failure.
func TestClientCancelStopsHandler(t *testing.T) {
	cases := []struct {
		name, path, body string
		headers          []string
		readFirst        bool // cancel after the first content chunk arrived
	}{
		{"during latency", "/v1/chat/completions", chat(`,"stream":true`), []string{fakellm.HeaderLatency, "1h"}, false},
		{"between chunks", "/v1/chat/completions", chat(`,"stream":true`), []string{fakellm.HeaderChunkInterval, "1h"}, true},
		{"anthropic between chunks", "/v1/messages", `{"max_tokens":9,"messages":[],"stream":true}`, []string{fakellm.HeaderChunkInterval, "1h"}, true},
		{"responses between chunks", "/v1/responses", `{"input":"x","stream":true}`, []string{fakellm.HeaderChunkInterval, "1h"}, true},
		{"non-stream generation", "/v1/chat/completions", chat(""), []string{fakellm.HeaderChunkInterval, "1h"}, false},
		{"between replay writes", "/v1/chat/completions", `{}`, []string{fakellm.HeaderReplay, "rec.sse", fakellm.HeaderSplit, "10", fakellm.HeaderChunkInterval, "1h"}, false},
	}
	dir := fixtureDir(t, map[string]string{"rec.sse": recorded})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fakellm.New(fakellm.Config{FixturesDir: dir})
			entered := make(chan struct{}, 1)
			returned := make(chan struct{}, 1)
			ts := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				defer func() { returned <- struct{}{} }()
				s.ServeHTTP(w, r)
			}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+c.path, strings.NewReader(c.body))
				req.Header.Set("anthropic-version", "2023-06-01")
				for i := 0; i+1 < len(c.headers); i += 2 {
					req.Header.Set(c.headers[i], c.headers[i+1])
				}
				resp, err := ts.Client().Do(req)
				if err != nil {
					done <- err
					return
				}
				defer resp.Body.Close()
				if c.readFirst {
					br := bufio.NewReader(resp.Body)
					for {
						line, err := br.ReadString('\n')
						if err != nil {
							done <- err
							return
						}
						if strings.Contains(line, "tok1 ") {
							break
						}
					}
					done <- nil
				}
				_, err = io.Copy(io.Discard, resp.Body)
				done <- err
			}()
			<-entered
			if c.readFirst {
				if err := <-done; err != nil {
					t.Fatalf("before the first chunk: %v", err)
				}
			}
			cancel()
			select {
			case <-returned:
			case <-time.After(30 * time.Second):
				t.Fatal("handler still running 30s after the client left")
			}
			if s.Calls() != 1 {
				t.Errorf("Calls = %d", s.Calls())
			}
		})
	}
}
