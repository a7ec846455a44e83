package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/proxy"
)

// TestResponseCutAtShutdownHandsItsContextOn: a Responses stream cut at the drain deadline
// after the provider named its answer is billed by the provider, which carries its context into
// a continuation of it (on another instance): the context it hands on is recorded, as for a
// stream its caller left, at its estimate with the chain's context in it. Recorded as nothing,
// that continuation, cut before its usage, was estimated from its new turn alone.
func TestResponseCutAtShutdownHandsItsContextOn(t *testing.T) {
	h := newHarness(t, nil)
	u, key := h.user("standard")
	first, handed := h.answerWithContext(u.ID, key, `{"model":"fake-gpt","input":"Read this long document."}`)

	resp := h.post(key, "/v1/responses", `{"model":"fake-gpt","stream":true,"previous_response_id":"`+first+`","input":"Summarise it."}`,
		map[string]string{fakellm.HeaderChunks: "10000", fakellm.HeaderChunkInterval: "20ms"})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, readAll(t, resp.Body))
	}
	rd := bufio.NewReader(resp.Body)
	var cut string
	for cut == "" {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			cut = gjson.Get(data, "response.id").Str
		}
	}
	h.srv.CutCalls()
	_, _ = io.ReadAll(rd)
	if run := h.run(u.ID, resp.Header.Get(proxy.RunIDHeader)); run.SettleSource.String != holds.SourceShutdown {
		t.Fatalf("cut call: run %+v, want settled by shutdown", run)
	}
	recorded, err := h.rdb.Get(context.Background(), h.keys.ResponseContext(u.ID, cut)).Int64()
	if err != nil || recorded < handed {
		t.Fatalf("context recorded for the cut answer %s: %d (%v), want at least the %d tokens the chain carries", cut, recorded, err, handed)
	}
}
