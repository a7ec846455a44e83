package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// reqSpec is one request a worker sends.
type reqSpec struct {
	key     string
	body    []byte
	stream  bool
	chunks  int // expected content chunks of a stream (order/loss check); 0: no check
	headers map[string]string
}

// sample is what one request observed.
type sample struct {
	ok      bool
	status  int
	errKind string
	lat     time.Duration // send -> body fully read
	ttfb    time.Duration // send -> first body line (streams)
	end     time.Time
	runID   string
	lost    int  // stream: expected content chunks not seen
	reorder bool // stream: a chunk out of order or duplicated
	noDone  bool // stream: no [DONE]
}

func newClient(conns int) *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns + 16,
		MaxIdleConnsPerHost: conns + 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

var contentTok = []byte(`"content":"tok`)

// do sends one chat request and reads its answer to the end: what it observed is its sample.
func do(ctx context.Context, c *http.Client, url string, rs reqSpec) sample {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(rs.body))
	if err != nil {
		return sample{errKind: "build: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+rs.key)
	for k, v := range rs.headers {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return sample{errKind: "cancelled"}
		}
		return sample{errKind: "transport: " + shortErr(err)}
	}
	defer resp.Body.Close()
	s := sample{status: resp.StatusCode, runID: resp.Header.Get("X-Tollgate-Run-Id")}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		s.lat, s.end = time.Since(t0), time.Now()
		s.errKind = "status " + strconv.Itoa(resp.StatusCode)
		if ctx.Err() != nil {
			s.errKind = "cancelled"
		}
		return s
	}
	if !rs.stream {
		_, err = io.Copy(io.Discard, resp.Body)
		s.end = time.Now()
		s.lat = s.end.Sub(t0)
		if err != nil {
			s.errKind = "body: " + shortErr(err)
			if ctx.Err() != nil {
				s.errKind = "cancelled"
			}
			return s
		}
		s.ok = true
		return s
	}
	return readStream(ctx, resp.Body, rs.chunks, t0, s)
}

// readStream reads a streamed answer to its end into s: its time to first byte, its latency,
// and the order/loss check of its content chunks ("tok<n> ", counted from 1; chunks expected,
// 0: no loss check) and of its [DONE].
func readStream(ctx context.Context, body io.Reader, chunks int, t0 time.Time, s sample) sample {
	br := bufio.NewReaderSize(body, 16<<10)
	next, seen, done := int64(1), 0, false
	for {
		line, err := br.ReadSlice('\n')
		if s.ttfb == 0 && len(line) > 0 {
			s.ttfb = time.Since(t0)
		}
		if len(line) > 0 {
			if bytes.HasPrefix(line, []byte("data: [DONE]")) {
				done = true
			} else if i := bytes.Index(line, contentTok); i >= 0 {
				rest := line[i+len(contentTok):]
				j := bytes.IndexByte(rest, ' ')
				if j > 0 {
					n, _ := strconv.ParseInt(string(rest[:j]), 10, 64)
					if n != next {
						s.reorder = true
					}
					next = n + 1
					seen++
				}
			}
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			s.end = time.Now()
			s.lat = s.end.Sub(t0)
			if !errors.Is(err, io.EOF) {
				// A stream cut short lost what it did not get: the stream figures count it.
				s.lost, s.noDone = lostOf(chunks, seen), !done
				s.errKind = "stream: " + shortErr(err)
				if ctx.Err() != nil {
					s.errKind = "cancelled" // the scenario's time ran out mid-stream
				}
				return s
			}
			break
		}
	}
	s.lost, s.noDone = lostOf(chunks, seen), !done
	s.ok = s.lost == 0 && !s.reorder && !s.noDone
	if !s.ok {
		s.errKind = "stream check"
	}
	return s
}

// lostOf is how many of a stream's expected content chunks were not seen (0: no check).
func lostOf(expected, seen int) int {
	if expected <= 0 {
		return 0
	}
	return max(0, expected-seen)
}

func shortErr(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	msg := err.Error()
	if len(msg) > 80 {
		msg = msg[len(msg)-80:]
	}
	return msg
}

// load runs conns workers; worker w sends spec(w, j) for j = 0, 1, ... until maxPerWorker
// requests (0: no bound), the total bound maxTotal (0: none), stopWorker says so, or d passes.
type load struct {
	conns        int
	maxPerWorker int
	maxTotal     int64
	d            time.Duration
	// stagger spreads the workers' first requests evenly over this time (0: all at once), so
	// that a scenario of long streams reaches its concurrency in a steady state rather than as
	// one burst of simultaneous starts.
	stagger time.Duration
	spec    func(w, j int) reqSpec
	// stopWorker, when set, ends a worker after a sample (the drain scenario).
	stopWorker func(w int, s sample) bool
}

type loadResult struct {
	samples []sample
	wall    time.Duration
	// timeUp: the load ended by its time d, not by its counts; then deadline is when d ran out (by the clock, as the workers stop on it).
	timeUp   bool
	deadline time.Time
	// cut: requests still unanswered drainGrace after the time was up (not samples).
	cut int
}

// drainGrace is how long requests already sent when a load's time is up may take to finish.
// Cancelling them at once would drop exactly the slowest requests of every run (a request is
// in flight at the deadline in proportion to its length), trimming the tail percentiles.
const drainGrace = 10 * time.Second

func (l load) run(c *http.Client, url string) loadResult {
	issue, cancelIssue := context.WithTimeout(context.Background(), l.d)
	defer cancelIssue()
	// The time is up by the clock, not once issue's timer has fired: that runs on a goroutine
	// of its own, a moment later on a busy machine, and a worker that asked in between sent a
	// request after the time was up.
	deadline, _ := issue.Deadline()
	ctx, cancel := context.WithTimeout(context.Background(), l.d+drainGrace)
	defer cancel()
	var total, cut atomic.Int64
	per := make([][]sample, l.conns)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range l.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]sample, 0, 256)
			if l.stagger > 0 {
				select {
				case <-issue.Done():
				case <-time.After(l.stagger * time.Duration(w) / time.Duration(l.conns)):
				}
			}
			for j := 0; l.maxPerWorker == 0 || j < l.maxPerWorker; j++ {
				if !time.Now().Before(deadline) {
					break // time is up: send nothing more; what was sent finishes
				}
				if l.maxTotal > 0 && total.Add(1) > l.maxTotal {
					break
				}
				s := do(ctx, c, url, l.spec(w, j))
				if s.errKind == "cancelled" {
					cut.Add(1) // still unanswered drainGrace after the time was up
					break
				}
				out = append(out, s)
				if l.stopWorker != nil && l.stopWorker(w, s) {
					break
				}
			}
			per[w] = out
		}()
	}
	wg.Wait()
	res := loadResult{wall: time.Since(t0), timeUp: !time.Now().Before(deadline), deadline: deadline, cut: int(cut.Load())}
	for _, p := range per {
		res.samples = append(res.samples, p...)
	}
	return res
}

func chatBody(tag string, w, j int, stream bool) []byte {
	st := ""
	if stream {
		st = `,"stream":true`
	}
	return fmt.Appendf(nil, `{"model":"fake-gpt","messages":[{"role":"user","content":"bench %s %d-%d"}]%s}`, tag, w, j, st)
}
