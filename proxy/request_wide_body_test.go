package proxy_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestWideTopLevelIsRefusedBeforeAHold: a body whose top level holds more than 1024 fields is
// refused 400 invalid_json as it is read: its top level was indexed by key (some 100 bytes a
// member against a few of body), some 350 MiB for a 4 MiB body of short keys, before anything
// was held. No hold, nothing forwarded. A top level of 1024 fields is served.
func TestWideTopLevelIsRefusedBeforeAHold(t *testing.T) {
	h := newHarness(t, nil)
	_, key := h.user("standard")
	wide := func(fields int) string {
		var b strings.Builder
		b.WriteString(`{"model":"fake-gpt","messages":[{"role":"user","content":"hi"}]`)
		for i := 2; i < fields; i++ {
			b.WriteString(`,"x` + strconv.Itoa(i) + `":0`)
		}
		return b.String() + "}"
	}
	h.postRefused(t, key, "/v1/chat/completions", wide(1025), nil, http.StatusBadRequest, "invalid_json")
	h.postOK(t, key, "/v1/chat/completions", wide(1024), nil)
}
