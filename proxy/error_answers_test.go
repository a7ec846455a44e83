package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestErrorAnswersTellRefusalsApart: tollgate_error_answers_total{status,code} moves by one
// for each error answer, under its code, where tollgate_requests_total has its status only:
// 503 billing_unavailable (the database stalled) apart from the other 503s, and 429
// too_many_in_flight apart from the other 429s. (Each of the gateway's error answers is
// checked one by one in TestEveryErrorAnswerIsClearAndLeavesNothing.)
func TestErrorAnswersTellRefusalsApart(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		// The stalled views answer at admit_timeout; every other call must be answered well
		// within it on a loaded machine (200 ms was the budget of the calls expected to pass
		// too, the first call's admission on a fresh pool and the views after the unlock).
		c.Limits.AdmitTimeout = 2 * time.Second
		c.Limits.KeyCacheTTL = time.Minute // the key stays cached while the tables are locked
	})
	u, key := h.user("standard")
	if status, _ := h.get(key, "/v1/credits"); status != http.StatusOK {
		t.Fatalf("GET /v1/credits: %d before the database stalls, want 200", status)
	}
	before := h.metricSeries("tollgate_error_answers_total")
	ctx := context.Background()
	lock, err := h.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "LOCK TABLES users WRITE, run_holds WRITE, usage_days WRITE"); err != nil {
		t.Fatal(err)
	}
	cached := h.keyStaysCached()
	status, body := h.get(key, "/v1/credits")
	if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		t.Fatal(err)
	}
	cached("/v1/credits with the database stalled")
	if status != http.StatusServiceUnavailable || errorCodeOf(body) != "billing_unavailable" {
		t.Fatalf("GET /v1/credits with the database stalled: %d %v, want 503 billing_unavailable", status, body)
	}
	wantMoved(t, before, h.metricSeries("tollgate_error_answers_total"), `code="billing_unavailable",status="503"`)

	zero := 0
	if err := h.store.SetUserLimits(ctx, u.ID, nil, &zero, nil); err != nil {
		t.Fatal(err)
	}
	before = h.metricSeries("tollgate_error_answers_total")
	h.postRefused(t, key, "/v1/chat/completions", chatBody, nil, http.StatusTooManyRequests, "too_many_in_flight")
	wantMoved(t, before, h.metricSeries("tollgate_error_answers_total"), `code="too_many_in_flight",status="429"`)
}

// wantMoved asserts that between two reads of tollgate_error_answers_total only series moved,
// and by one.
func wantMoved(t *testing.T, before, after map[string]int64, series string) {
	t.Helper()
	for s, n := range after {
		want := int64(0)
		if s == series {
			want = 1
		}
		if n-before[s] != want {
			t.Errorf("tollgate_error_answers_total{%s} moved by %d, want %d", s, n-before[s], want)
		}
	}
	if _, ok := after[series]; !ok {
		t.Errorf("tollgate_error_answers_total{%s} not counted", series)
	}
}

// TestCallerStringsNeverBecomeLabels: what a caller chooses — a model's name, a path, a
// header's value, a field's name — is never a label of any series the gateway exposes: its
// error answers are counted by the gateway's own codes, so no caller can open series at will.
func TestCallerStringsNeverBecomeLabels(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	const mark = "zqxcallerchosen"
	for _, c := range []struct {
		path, body string
		hdr        map[string]string
	}{
		{"/v1/chat/completions", `{"model":"` + mark + `","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"/v1/" + mark, chatBody, nil},
		{"/v1/models/" + mark, "", nil},
		{"/v1/runs/" + mark, "", nil},
		{"/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": mark + " !"}},
		{"/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": strings.Repeat(mark, 40)}},
		{"/v1/chat/completions", `{"model":"fake-gpt","` + mark + `":1,"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"/v1/chat/completions", `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"max_tokens":"` + mark + `"}`, nil},
		{"/admin/" + mark, "", nil},
	} {
		var resp *http.Response
		if c.body == "" {
			req, err := http.NewRequest(http.MethodGet, h.gw.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+key)
			if resp, err = http.DefaultClient.Do(req); err != nil {
				t.Fatal(err)
			}
		} else {
			resp = h.post(key, c.path, c.body, c.hdr)
		}
		readAll(t, resp.Body)
		resp.Body.Close()
	}
	h.settled()
	resp, err := http.Get(h.gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	scraped, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(scraped), "tollgate_error_answers_total{") {
		t.Fatal("no error answer counted")
	}
	for _, line := range strings.Split(string(scraped), "\n") {
		if strings.Contains(line, mark) {
			t.Errorf("a caller's string became a label: %s", line)
		}
	}
}
