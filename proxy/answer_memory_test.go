package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
)

// TestWholeAnswersInMemoryAreBounded: the non-streamed answers a process reads whole before
// relaying them are bounded in all (limits.max_response_memory). An answer that does not fit
// waits for room — the provider made it and bills it — and goes out when another leaves; one
// that finds no room within its wait is answered 503 server_busy and charged the usage its
// end reports, as a call cut at shutdown is charged what it used. Without the bound, answers
// of max_response_bytes each, as many as callers asked for at once, could take the process's
// memory, and the process killed by it would charge every call in flight its hold.
func TestWholeAnswersInMemoryAreBounded(t *testing.T) {
	const (
		heldSize  = 12 << 10 // counted whole from its Content-Length: 12 KiB and one byte
		otherSize = 14 << 10 // does not fit beside it in 24 KiB
	)
	for _, tc := range []struct {
		name       string
		chunked    bool          // the second answer comes without a Content-Length
		wait       time.Duration // how long an answer waits for room
		wantStatus int
	}{
		{name: "an answer of known length waits for room", wait: time.Minute, wantStatus: http.StatusOK},
		{name: "a growing answer waits for room", chunked: true, wait: time.Minute, wantStatus: http.StatusOK},
		{name: "an answer finding no room is refused, charged", wait: 50 * time.Millisecond, wantStatus: http.StatusServiceUnavailable},
		{name: "a growing answer finding no room is refused, charged", chunked: true, wait: 50 * time.Millisecond,
			wantStatus: http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &sizedAnswers{arrived: make(chan struct{}, 1), release: map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{})}}
			upSrv := httptest.NewServer(up)
			t.Cleanup(upSrv.Close)
			h := newHarness(t, func(c *config.Config) {
				c.Upstreams = []config.Upstream{{Name: "sized", Kind: "openai", BaseURL: upSrv.URL, Models: []string{"*"}}}
				c.Limits.MaxResponseBytes, c.Limits.MaxResponseMemory = 16<<10, 24<<10
				// The second answer names the model that answered, priced apart: 7 and 9
				// tokens at 1000 USD/M cost 16 000 micro-USD, where fake-gpt's cost 108.
				c.Models[answeredModel] = config.ModelCfg{Input: config.USDPerM{Micro: 1000_000_000}, Output: config.USDPerM{Micro: 1000_000_000}}
			})
			h.srv.SetAnswerMemoryWait(tc.wait)
			// Let the held answer go before the harness closes (cleanups run last first), also
			// when the test fails early.
			release, releaseSecond := sync.OnceFunc(func() { close(up.release["1"]) }), sync.OnceFunc(func() { close(up.release["2"]) })
			t.Cleanup(release)
			t.Cleanup(releaseSecond)
			holder, holderKey := h.user("standard")
			other, otherKey := h.user("standard")
			chat := `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`

			held := make(chan *http.Response, 1)
			go func() {
				held <- h.post(holderKey, "/v1/chat/completions", chat,
					map[string]string{"X-Test-Size": strconv.Itoa(heldSize), "X-Test-Hold": "1"})
			}()
			select {
			case <-up.arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the held answer never reached the upstream")
			}
			waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n == heldSize+1 }, "the held answer counted whole")

			hdr := map[string]string{"X-Test-Size": strconv.Itoa(otherSize), "X-Test-Model": answeredModel}
			if tc.chunked {
				hdr["X-Test-Chunked"] = "1"
			}
			second := make(chan *http.Response, 1)
			go func() { second <- h.post(otherKey, "/v1/chat/completions", chat, hdr) }()
			waitGauge(h, "tollgate_response_memory_waits_total", func(n int64) bool { return n >= 1 }, "the second answer waiting")

			var resp *http.Response
			if tc.wantStatus == http.StatusOK {
				// Waiting: it goes out once the held answer leaves memory.
				release()
				resp = <-second
			} else {
				resp = <-second // refused while the held answer is still in memory
				release()
			}
			answer := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("second answer: %d %s, want %d", resp.StatusCode, answer, tc.wantStatus)
			}
			if tc.wantStatus == http.StatusServiceUnavailable {
				// Charged what it used: an SDK's retry would be charged again (writeCallError).
				if code := errorCode(t, answer); code != "server_busy" || resp.Header.Get("Retry-After") != "" ||
					resp.Header.Get("X-Should-Retry") != "false" {
					t.Fatalf("refused %s, Retry-After %q, X-Should-Retry %q; want server_busy, none, false",
						code, resp.Header.Get("Retry-After"), resp.Header.Get("X-Should-Retry"))
				}
				// Its words agree with its headers: a person or an agent reading it is told a retry
				// is charged again, not to retry shortly.
				if msg := string(answer); strings.Contains(msg, "Retry shortly") || !strings.Contains(msg, "a retry is charged again") {
					t.Fatalf("refusal's message %.300s: want it to say a retry is charged again", msg)
				}
			} else if len(answer) != otherSize {
				t.Fatalf("second answer %d bytes, want %d", len(answer), otherSize)
			}

			first := <-held
			body := readAll(t, first.Body)
			first.Body.Close()
			if first.StatusCode != http.StatusOK || len(body) != heldSize {
				t.Fatalf("held answer: %d, %d bytes; want 200, %d bytes", first.StatusCode, len(body), heldSize)
			}
			// Each is charged the usage its answer reports, at the price of the model that
			// answered, the refused one too (whose model is read from its head).
			for _, c := range []struct {
				who    string
				user   holds.User
				resp   *http.Response
				source string
				cost   int64
			}{{"held", holder, first, holds.SourceComplete, 108}, {"second", other, resp, holds.SourceComplete, 16_000}} {
				if c.resp == resp && tc.wantStatus != http.StatusOK {
					c.source = holds.SourceStreamError
				}
				run := h.run(c.user.ID, c.resp.Header.Get("X-Tollgate-Run-Id"))
				if run.State != holds.StateSettled || run.InTok != 7 || run.OutTok != 9 || run.Estimated || run.SettleSource.String != c.source ||
					run.CostMicro != c.cost {
					t.Errorf("%s answer's run: %s, %d in, %d out, estimated %v, source %q, cost %d; want settled 7 in, 9 out from the report, source %s, cost %d",
						c.who, run.State, run.InTok, run.OutTok, run.Estimated, run.SettleSource.String, run.CostMicro, c.source, c.cost)
				}
			}
			if tc.wantStatus == http.StatusServiceUnavailable {
				// An answer too large by its Content-Length waits for no room, full as the
				// memory is: it is 502 not to be retried (a 503 would be retried, and charged
				// again each time), at once, charged its usage.
				held = make(chan *http.Response, 1)
				go func() {
					held <- h.post(holderKey, "/v1/chat/completions", chat,
						map[string]string{"X-Test-Size": strconv.Itoa(heldSize), "X-Test-Hold": "2"})
				}()
				<-up.arrived
				waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n == heldSize+1 }, "the held answer counted whole")
				h.srv.SetAnswerMemoryWait(time.Minute)
				big := h.post(otherKey, "/v1/chat/completions", chat, map[string]string{"X-Test-Size": strconv.Itoa(20 << 10)})
				answer := readAll(t, big.Body)
				big.Body.Close()
				// A web page refused for room is no model's answer, charged nothing, as it is
				// when relayBody reads it whole.
				h.srv.SetAnswerMemoryWait(tc.wait)
				page := h.post(otherKey, "/v1/chat/completions", chat, map[string]string{"X-Test-Size": strconv.Itoa(otherSize), "X-Test-Html": "1"})
				pageAnswer := readAll(t, page.Body)
				page.Body.Close()
				releaseSecond()
				if run := h.run(other.ID, page.Header.Get("X-Tollgate-Run-Id")); page.StatusCode != http.StatusBadGateway ||
					errorCode(t, pageAnswer) != "upstream_error" || run.ChargedMicro != 0 || run.SettleSource.String != holds.SourceUpstreamError {
					t.Errorf("a web page refused for room: %d %s, run charged %d by %q; want 502 upstream_error, nothing charged",
						page.StatusCode, pageAnswer, run.ChargedMicro, run.SettleSource.String)
				}
				if big.StatusCode != http.StatusBadGateway || errorCode(t, answer) != "upstream_response_too_large" || big.Header.Get("X-Should-Retry") != "false" {
					t.Errorf("an answer over the limit by its length, memory full: %d %s, want 502 upstream_response_too_large, not to be retried", big.StatusCode, answer)
				}
				if run := h.run(other.ID, big.Header.Get("X-Tollgate-Run-Id")); run.InTok != 7 || run.OutTok != 9 || run.Estimated {
					t.Errorf("the answer over the limit: %d in, %d out, estimated %v; want its report's 7 and 9", run.InTok, run.OutTok, run.Estimated)
				}
				if first := <-held; first.StatusCode != http.StatusOK {
					t.Errorf("held answer: %d", first.StatusCode)
				} else {
					readAll(t, first.Body)
					first.Body.Close()
				}
			}
			waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n == 0 }, "every answer's memory given back")
		})
	}
}

// answeredModel is the model the second answer of TestWholeAnswersInMemoryAreBounded names.
const answeredModel = "fake-gpt-answered"

// sizedAnswers answers chat completions whole, padded to the size X-Test-Size names, with a
// usage report of 7 prompt and 9 completion tokens at their end, naming the model X-Test-Model
// names (fake-gpt if none), or a web page of that size with X-Test-Html; under a
// Content-Length unless X-Test-Chunked is set. One with X-Test-Hold sends its first KiB, then
// waits until the release it names closes.
type sizedAnswers struct {
	arrived chan struct{}
	release map[string]chan struct{} // by X-Test-Hold; written before the test's calls
}

func (u *sizedAnswers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	size, err := strconv.Atoi(r.Header.Get("X-Test-Size"))
	if err != nil {
		http.Error(w, "X-Test-Size: "+err.Error(), http.StatusBadRequest)
		return
	}
	model := r.Header.Get("X-Test-Model")
	if model == "" {
		model = "fake-gpt"
	}
	body := answerOfSize(size, model)
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("X-Test-Html") != "" {
		body = []byte("<html>" + strings.Repeat("x", size-len("<html>")))
		w.Header().Set("Content-Type", "text/html")
	}
	if r.Header.Get("X-Test-Chunked") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	if gate := u.release[r.Header.Get("X-Test-Hold")]; gate != nil {
		_, _ = w.Write(body[:1024])
		_ = http.NewResponseController(w).Flush()
		u.arrived <- struct{}{}
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		body = body[1024:]
	}
	_, _ = w.Write(body)
}

// answerOfSize is a chat completion by model of exactly size bytes.
func answerOfSize(size int, model string) []byte {
	head := `{"id":"chatcmpl-1","object":"chat.completion","model":"` + model + `","choices":[{"index":0,"message":{"role":"assistant","content":"`
	const tail = `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}`
	return []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
}

// TestOneCallerHoldsAtMostItsShareOfWholeAnswers: a caller's whole answers in memory are
// bounded apart from the process's (limits.max_response_memory_per_caller, a 16th of
// max_response_memory or one largest answer if more), as its request bodies are. An answer
// is held until its caller has read it, and a caller reading at a trickle holds it for as
// long: without the share, one caller with a few answers of max_response_bytes in flight (a
// cheap embeddings list is tens of MB) took the whole bound, and every other caller's whole
// answer waited, was answered 503 server_busy and was charged. Past its share a caller's own
// answer waits for its other answers to leave, as any answer waits for room, and then is
// refused (503 server_busy, charged what it used); the other callers' answers find room.
func TestOneCallerHoldsAtMostItsShareOfWholeAnswers(t *testing.T) {
	const (
		heldSize  = 12 << 10 // counted whole from its Content-Length: 12 KiB and one byte
		otherSize = 14 << 10 // fits beside one held answer in 36 KiB, not beside two
	)
	up := &sizedAnswers{arrived: make(chan struct{}, 1), release: map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{})}}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "sized", Kind: "openai", BaseURL: upSrv.URL, Models: []string{"*"}}}
		// A caller's share is derived: one largest answer (16 KiB), more than 36 KiB / 16.
		c.Limits.MaxResponseBytes, c.Limits.MaxResponseMemory = 16<<10, 36<<10
	})
	h.srv.SetAnswerMemoryWait(50 * time.Millisecond)
	release1, release2 := sync.OnceFunc(func() { close(up.release["1"]) }), sync.OnceFunc(func() { close(up.release["2"]) })
	t.Cleanup(release1)
	t.Cleanup(release2)
	_, holderKey := h.user("standard")
	_, otherKey := h.user("standard")
	chat := `{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]}`

	// The holder's first answer, held in memory (its caller, or its upstream, slow).
	first := make(chan *http.Response, 1)
	go func() {
		first <- h.post(holderKey, "/v1/chat/completions", chat, map[string]string{"X-Test-Size": strconv.Itoa(heldSize), "X-Test-Hold": "1"})
	}()
	arrived(t, up)
	waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n == heldSize+1 }, "the first answer counted whole")

	// Its second: past its share (two of 12 KiB in 16 KiB), it waits, and does not count.
	second := make(chan *http.Response, 1)
	go func() {
		// Another body: the same one at once would be refused as a duplicate of the first.
		second <- h.post(holderKey, "/v1/chat/completions", strings.Replace(chat, "hi", "hi again", 1), map[string]string{"X-Test-Size": strconv.Itoa(heldSize), "X-Test-Hold": "2"})
	}()
	arrived(t, up)
	deadline := time.Now().Add(10 * time.Second)
	for h.gauge("tollgate_response_memory_waits_total") < 1 && h.gauge("tollgate_response_body_bytes") < 2*(heldSize+1) {
		if time.Now().After(deadline) {
			t.Fatal("the holder's second answer neither waited for room nor was counted")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, as waitGauge does
	}

	// Another caller's answer finds room beside what the holder may hold.
	other := h.post(otherKey, "/v1/chat/completions", chat, map[string]string{"X-Test-Size": strconv.Itoa(otherSize)})
	answer := readAll(t, other.Body)
	other.Body.Close()
	if other.StatusCode != http.StatusOK || len(answer) != otherSize {
		t.Errorf("another caller's answer while one caller holds two: %d %.200s, want 200 with its %d bytes", other.StatusCode, answer, otherSize)
	}

	release2()
	resp := <-second
	body := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(t, body) != "server_busy" || !strings.Contains(string(body), "one caller") {
		t.Errorf("the holder's answer past its share: %d %.200s, want 503 server_busy naming the caller's share", resp.StatusCode, body)
	}
	release1()
	resp = <-first
	body = readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(body) != heldSize {
		t.Errorf("the holder's first answer: %d, %d bytes; want 200, %d bytes", resp.StatusCode, len(body), heldSize)
	}
	waitGauge(h, "tollgate_response_body_bytes", func(n int64) bool { return n == 0 }, "every answer's memory given back")
}

// arrived waits for the held answer of up to reach its upstream.
func arrived(t *testing.T, up *sizedAnswers) {
	t.Helper()
	select {
	case <-up.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the held answer never reached the upstream")
	}
}
