package proxy

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// TestBatchOfEmptyPromptsAllocatesLessThanItsBody: reading a 4 MiB completions body of empty
// prompts, with echo, allocates less than the body itself (which bodyMemory counts). Each
// prompt was kept apart, its estimate and its echo, 24 bytes and more against 3 of body, grown
// by append: some 190 MiB allocated and 40 MiB kept, before anything was held.
func TestBatchOfEmptyPromptsAllocatesLessThanItsBody(t *testing.T) {
	s := rewriteServer(t)
	const size = 4 << 20
	n := (size - 100) / 3
	body := []byte(`{"model":"fake-gpt","echo":true,"max_tokens":1,"prompt":[""` + strings.Repeat(`,""`, n-1) + `]}`)
	rt := routeFor(t, "/v1/completions")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, aerr := s.parseCall(rt, body, http.Header{})
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(c)
	if aerr == nil {
		t.Errorf("a batch of %d prompts was accepted", n)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(body)) {
		t.Errorf("reading a body of %d bytes allocated %d bytes", len(body), got)
	}
}
