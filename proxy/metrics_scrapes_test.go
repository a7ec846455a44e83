package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/proxy"
)

// blockingCollector holds every scrape inside Collect until released: scrapes in flight.
type blockingCollector struct {
	desc    *prometheus.Desc
	entered chan struct{}
	release chan struct{}
}

func (c *blockingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *blockingCollector) Collect(ch chan<- prometheus.Metric) {
	c.entered <- struct{}{}
	<-c.release
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1)
}

// TestMetricsScrapesAreBounded: /metrics answers without a key, and each scrape gathers every
// series; past a few at once a scrape is refused (503) rather than piling up goroutines and
// memory at a caller's pace.
func TestMetricsScrapesAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := &blockingCollector{desc: prometheus.NewDesc("test_blocking", "holds scrapes", nil, nil),
		entered: make(chan struct{}), release: make(chan struct{})}
	reg.MustRegister(c)
	h := proxy.NewMetrics(reg).Handler()

	var wg sync.WaitGroup
	codes := make(chan int, proxy.MaxScrapesAtOnce)
	for range proxy.MaxScrapesAtOnce {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			codes <- rec.Code
		}()
		<-c.entered // this scrape is in flight
	}
	// One more: either it is refused at once, or it gathers (enters Collect) beside the others.
	probe := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		probe <- rec
	}()
	select {
	case rec := <-probe:
		// Refused as every error of the gateway is, in OpenAI's shape.
		if rec.Code != http.StatusServiceUnavailable || errorCode(t, rec.Body.Bytes()) != "server_busy" || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("scrape past %d in flight: %d %q, Retry-After %q; want 503 server_busy, 1",
				proxy.MaxScrapesAtOnce, rec.Code, rec.Body, rec.Header().Get("Retry-After"))
		}
	case <-c.entered:
		close(c.release)
		t.Fatalf("a scrape past %d in flight was served beside them", proxy.MaxScrapesAtOnce)
	}
	close(c.release)
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusOK {
			t.Fatalf("a scrape within the bound: %d, want 200", code)
		}
	}
}
