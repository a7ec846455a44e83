package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

// TestTwoGrowingAnswersOfACallerDoNotStarveEachOther: two answers of one caller without a
// Content-Length, each past half its share, grow their buffers by doubling: each holds part
// of the share and waits for the rest, which the other holds: both were refused 503
// server_busy after the wait, and charged, where one after the other both fit.
func TestTwoGrowingAnswersOfACallerDoNotStarveEachOther(t *testing.T) {
	const size = 9 << 10 // a buffer of 16 KiB: two of them pass the 16 KiB share, one at a time fit
	up := &sizedAnswers{arrived: make(chan struct{}, 2), release: map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{})}}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "sized", Kind: "openai", BaseURL: upSrv.URL, Models: []string{"*"}}}
		c.Limits.MaxResponseBytes, c.Limits.MaxResponseMemory = 16<<10, 36<<10
	})
	h.srv.SetAnswerMemoryWait(3 * time.Second)
	_, key := h.user("standard")
	var wg sync.WaitGroup
	status := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"fake-gpt","messages":[{"role":"user","content":"hi ` + strconv.Itoa(i) + `"}]}`
			resp := h.post(key, "/v1/chat/completions", body, map[string]string{"X-Test-Size": strconv.Itoa(size),
				"X-Test-Chunked": "1", "X-Test-Hold": strconv.Itoa(i + 1)})
			b := readAll(t, resp.Body)
			resp.Body.Close()
			status[i] = resp.StatusCode
			if resp.StatusCode != http.StatusOK {
				t.Logf("answer %d: %d %.200s", i, resp.StatusCode, b)
			}
		}()
	}
	arrived(t, up)
	arrived(t, up)
	// Both counted, each its first KiB read (a buffer of 2 KiB), before either reads on.
	waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n >= 2*2048 }, "both answers counted")
	close(up.release["1"])
	close(up.release["2"])
	wg.Wait()
	if status[0] != http.StatusOK || status[1] != http.StatusOK {
		t.Fatalf("two answers of a caller that fit its share one after the other: %v, want both 200", status)
	}
}
