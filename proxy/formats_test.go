package proxy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

// expectedUsage is one entry of shared/fixtures/usage/expected.json.
type expectedUsage struct {
	Input         int64 `json:"input"`
	CacheRead     int64 `json:"cache_read"`
	CacheWrite    int64 `json:"cache_write"`
	Output        int64 `json:"output"`
	Reported      bool  `json:"reported"`
	UpstreamError bool  `json:"upstream_error"`
}

func loadExpected(t *testing.T, dir string) map[string]expectedUsage {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]expectedUsage
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	if len(out) < 30 {
		t.Fatalf("expected.json lists only %d files", len(out))
	}
	return out
}

// fixtureRequest is the request a fixture answers: the route its wire format belongs to, and
// a body for that route (fakellm replays the file whatever the body says).
func fixtureRequest(name string, includeUsage bool) (path, body string) {
	stream := strings.HasSuffix(name, ".sse")
	switch {
	case strings.HasPrefix(name, "anthropic_"):
		return "/v1/messages", `{"model":"claude-test","max_tokens":4096,"stream":` + strconv.FormatBool(stream) +
			`,"messages":[{"role":"user","content":"hi"}]}`
	case strings.Contains(name, "responses"):
		return "/v1/responses", `{"model":"fake-gpt","stream":` + strconv.FormatBool(stream) + `,"input":"hi"}`
	case strings.Contains(name, "embeddings"):
		return "/v1/embeddings", `{"model":"fake-gpt","input":"hi"}`
	case strings.Contains(name, "legacy_completions"):
		path = "/v1/completions"
		body = `{"model":"fake-gpt","prompt":"hi","stream":` + strconv.FormatBool(stream)
	default:
		path = "/v1/chat/completions"
		body = `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"stream":` + strconv.FormatBool(stream)
	}
	if stream && includeUsage {
		body += `,"stream_options":{"include_usage":true}`
	}
	return path, body + "}"
}

// TestEveryFixtureBillsItsExpectedUsage replays every recorded provider response through the
// real HTTP path: the settled run's tokens equal expected.json, and the client receives the
// upstream's bytes unchanged. Then again with every file in CRLF, and with the small files
// written one byte at a time.
func TestEveryFixtureBillsItsExpectedUsage(t *testing.T) {
	lf := testenv.FixturesDir(t)
	crlf := t.TempDir()
	expected := loadExpected(t, lf)
	for name := range expected {
		raw, err := os.ReadFile(filepath.Join(lf, name))
		if err != nil {
			t.Fatalf("%s listed in expected.json: %v", name, err)
		}
		conv := bytes.ReplaceAll(bytes.ReplaceAll(raw, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
		if err := os.WriteFile(filepath.Join(crlf, name), conv, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, variant := range []struct {
		name, dir string
		split     bool
	}{{"LF", lf, false}, {"CRLF", crlf, false}, {"LF byte by byte", lf, true}, {"CRLF byte by byte", crlf, true}} {
		t.Run(variant.name, func(t *testing.T) {
			h := newHarnessWithFixtures(t, variant.dir, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
			u, key := h.user("standard")
			replayed := 0
			defer func() {
				if replayed == 0 {
					t.Error("no fixture was replayed")
				}
			}()
			for name, want := range expected {
				raw, _ := os.ReadFile(filepath.Join(variant.dir, name))
				hdr := map[string]string{fakellm.HeaderReplay: name}
				if variant.split {
					if len(raw) > 4096 {
						continue
					}
					hdr[fakellm.HeaderSplit] = everyOffset(len(raw))
				}
				replayed++
				path, body := fixtureRequest(name, true)
				resp := h.post(key, path, body, hdr)
				got := readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%s: status %d: %s", name, resp.StatusCode, got)
				}
				if !bytes.Equal(got, raw) {
					t.Errorf("%s: client received %d bytes that differ from the upstream's %d", name, len(got), len(raw))
				}
				checkFixtureRun(t, h, u.ID, resp.Header.Get(proxy.RunIDHeader), name, want)
			}
		})
	}
}

// TestUnrequestedUsageChunkIsRemovedFromFixtures replays the chat streams to a client that did
// not ask for usage: it receives the upstream's events less the usage-only ones, and is still
// charged the reported usage.
func TestUnrequestedUsageChunkIsRemovedFromFixtures(t *testing.T) {
	dir := testenv.FixturesDir(t)
	expected := loadExpected(t, dir)
	h := newHarness(t, func(c *configT) { c.Plans["standard"] = bigPlan(c.Plans["standard"]) })
	u, key := h.user("standard")
	replayed := 0
	for name, want := range expected {
		path, body := fixtureRequest(name, false)
		if !strings.HasSuffix(name, ".sse") || (path != "/v1/chat/completions" && path != "/v1/completions") {
			continue
		}
		replayed++
		raw, _ := os.ReadFile(filepath.Join(dir, name))
		resp := h.post(key, path, body, map[string]string{fakellm.HeaderReplay: name})
		got := readAll(t, resp.Body)
		resp.Body.Close()
		if wantBytes := withoutUsageOnlyEvents(t, raw); !bytes.Equal(got, wantBytes) {
			t.Errorf("%s: client received %d bytes, want %d (upstream less usage-only chunks)", name, len(got), len(wantBytes))
		}
		checkFixtureRun(t, h, u.ID, resp.Header.Get(proxy.RunIDHeader), name, want)
	}
	if replayed == 0 {
		t.Fatal("no chat or completions stream among the fixtures")
	}
}

func withoutUsageOnlyEvents(t *testing.T, raw []byte) []byte {
	t.Helper()
	var out []byte
	sc := metering.NewScanner(bytes.NewReader(raw), 1<<20)
	for {
		ev, err := sc.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if !metering.IsUsageOnlyChunk(ev.Data) {
			out = append(out, ev.Raw...)
		}
	}
}

// errorBeforeOutput are the fixtures whose provider reports an error (after its 200) before
// any output and without a usage; expected.json marks them unreported upstream errors.
var errorBeforeOutput = map[string]bool{"openai_responses_stream_error_then_failed.sse": true}

func checkFixtureRun(t *testing.T, h *harness, userID uint64, runID, name string, want expectedUsage) {
	t.Helper()
	run := h.run(userID, runID)
	if run.State != holds.StateSettled {
		t.Errorf("%s: run %s is %s", name, runID, run.State)
		return
	}
	wantSource := holds.SourceComplete
	if want.UpstreamError {
		wantSource = holds.SourceStreamError
	}
	if errorBeforeOutput[name] {
		// The provider reported its failure before producing anything: nothing to charge.
		if run.SettleSource.String != holds.SourceUpstreamError || run.ChargedMicro != 0 || run.Estimated {
			t.Errorf("%s: settled by %q, charged %d, estimated %v; want upstream_error at 0",
				name, run.SettleSource.String, run.ChargedMicro, run.Estimated)
		}
		return
	}
	if run.SettleSource.String != wantSource {
		t.Errorf("%s: settled by %q, want %q", name, run.SettleSource.String, wantSource)
	}
	if run.Estimated == want.Reported {
		t.Errorf("%s: estimated = %v, but reported = %v", name, run.Estimated, want.Reported)
	}
	if !want.Reported {
		return
	}
	if run.InTok != want.Input || run.CacheReadTok != want.CacheRead || run.CacheWriteTok != want.CacheWrite || run.OutTok != want.Output {
		t.Errorf("%s: billed in=%d cache_read=%d cache_write=%d out=%d, want %+v",
			name, run.InTok, run.CacheReadTok, run.CacheWriteTok, run.OutTok, want)
	}
	// Cost at fake-gpt prices, computed by hand: 2.50 / 1.25 / 3.125 / 10.00 USD per million.
	cost := (run.InTok*2_500_000 + run.CacheReadTok*1_250_000 + run.CacheWriteTok*3_125_000 + run.OutTok*10_000_000 + 999_999) / 1_000_000
	if run.CostMicro != cost {
		t.Errorf("%s: cost %d, want %d", name, run.CostMicro, cost)
	}
}

func everyOffset(n int) string {
	var b strings.Builder
	for i := 1; i < n; i++ {
		if i > 1 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
	}
	return b.String()
}
