package proxy

import (
	"net/http"
	"runtime"
	"strconv"
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
	aerr, got := parseAllocating(s, rt, body)
	if aerr == nil {
		t.Errorf("a batch of %d prompts was accepted", n)
	}
	if got > uint64(len(body)) {
		t.Errorf("reading a body of %d bytes allocated %d bytes", len(body), got)
	}
}

// TestWideTopLevelAllocatesLessThanItsBody: reading a 4 MiB body whose top level holds 400 000
// short keys allocates less than the body itself. Its top level was indexed by key twice
// (indexTop, the prompt's estimate), each some 100 bytes a member: some 350 MiB allocated
// before anything was held.
func TestWideTopLevelAllocatesLessThanItsBody(t *testing.T) {
	s := rewriteServer(t)
	var b strings.Builder
	b.WriteString(`{"model":"fake-gpt","messages":[]`)
	for i := 0; b.Len() < 4<<20-16; i++ {
		b.WriteString(`,"` + strconv.FormatInt(int64(i), 36) + `":0`)
	}
	body := []byte(b.String() + "}")
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings", anthropicPath} {
		rt := routeFor(t, path)
		aerr, got := parseAllocating(s, rt, body)
		if aerr == nil || aerr.Status != http.StatusBadRequest {
			t.Errorf("%s: a top level of %d bytes of keys was not refused 400: %+v", path, len(body), aerr)
		}
		if got > uint64(len(body)) {
			t.Errorf("%s: reading a body of %d bytes allocated %d bytes", path, len(body), got)
		}
	}
}

// TestWideNestedObjectAllocatesLittleMoreThanItsBody: reading a 4 MiB body one of whose objects
// below the top level (a message, a tool's schema, metadata) holds 400 000 short keys allocates
// at most a few times the body (two lists of views of its keys, each grown by doubling: some 6
// times the body for a message, 8 under the race detector). Each object's keys were kept in a set as they came, by the
// check for a key repeated anywhere and again, folded, by the check of a message's keys: some
// 140 MiB allocated for a message before anything was held. Its keys are now sorted once it has
// been read, as views of the body.
func TestWideNestedObjectAllocatesLittleMoreThanItsBody(t *testing.T) {
	s := rewriteServer(t)
	wide := func(head, tail string) []byte {
		var b strings.Builder
		b.WriteString(head)
		for i := 0; b.Len() < 4<<20-64; i++ {
			b.WriteString(`,"k` + strconv.FormatInt(int64(i), 36) + `":0`)
		}
		return []byte(b.String() + tail)
	}
	for name, body := range map[string][]byte{
		"message":  wide(`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"`, `}]}`),
		"metadata": wide(`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"metadata":{"a":"b"`, `}}`),
		"schema": wide(`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{}`,
			`}}}}]}`),
	} {
		rt := routeFor(t, "/v1/chat/completions")
		aerr, got := parseAllocating(s, rt, body)
		t.Logf("%s: a body of %d bytes allocated %d bytes (refused: %v)", name, len(body), got, aerr)
		if got > 12*uint64(len(body)) {
			t.Errorf("%s: reading a body of %d bytes allocated %d bytes", name, len(body), got)
		}
	}
}

// parseAllocating parses body for rt and returns its refusal and the bytes allocated meanwhile.
func parseAllocating(s *Server, rt *route, body []byte) (*apiError, uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, aerr := s.parseCall(rt, body, http.Header{})
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(c)
	return aerr, after.TotalAlloc - before.TotalAlloc
}
