package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
)

const hostileChunk = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
	"Hello billing team, here is a fairly long answer for you.\"}}]}\n\n"
const hostileUsage = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":400,\"total_tokens\":410}}\n\n"

// hostileHarness is a gateway whose only upstream is the handler given.
func hostileHarness(t *testing.T, upstream http.HandlerFunc, mutate func(*config.Config)) *harness {
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	return newHarness(t, func(c *config.Config) {
		c.Upstreams = []config.Upstream{{Name: "hostile", Kind: "openai", BaseURL: srv.URL, Models: []string{"*"}}}
		if mutate != nil {
			mutate(c)
		}
	})
}

// fixedAnswerHarness is a gateway whose only upstream answers every call with answer, as an
// event stream when stream is set, else as JSON.
func fixedAnswerHarness(t *testing.T, stream bool, answer string) *harness {
	return hostileHarness(t, func(w http.ResponseWriter, _ *http.Request) {
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		fmt.Fprint(w, answer)
	}, nil)
}

// maxStacksOfOneCall is the most the process's goroutine stacks may grow to while one hostile
// call (a body or an answer nested deep) is served: a recursive descent through it grows one
// stack by a frame per level, hundreds of MiB for a few MiB of brackets, and past 1 GB the
// runtime kills the process.
const maxStacksOfOneCall = 64 << 20

// watchPeakStack samples the memory in use by goroutine stacks, every 2 ms, until the function
// it returns is called; that returns the largest sample.
func watchPeakStack() (peak func() uint64) {
	var most atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.StackInuse > most.Load() {
				most.Store(ms.StackInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return most.Load()
	}
}
