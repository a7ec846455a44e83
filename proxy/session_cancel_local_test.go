package proxy_test

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestSessionRunReplacedOnItsOwnProcessIsStoppedThoughTheCancelCannotBeSent: a newer message
// of a session, served by the process that serves the running one, whose cancel cannot be sent
// through Redis (every write of it lost). The cancel went only through Redis pub/sub, even to a
// run of the sender's own process: the old run went on to its end beside the newer message and
// was charged in full. It is now stopped at once, there, and charged what it used.
func TestSessionRunReplacedOnItsOwnProcessIsStoppedThoughTheCancelCannotBeSent(t *testing.T) {
	h, lossy := newLossyRedisHarness(t, harnessSetup{}, nil)
	u, key := h.user("standard")
	const chunks = 3000 // 5 ms each: 15 s, so that only a cancel ends it early
	a := h.post(key, "/v1/chat/completions",
		`{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"tell me a long story"}]}`,
		map[string]string{proxy.SessionHeader: "s", fakellm.HeaderChunks: strconv.Itoa(chunks), fakellm.HeaderChunkInterval: "5ms"})
	defer a.Body.Close()
	aRun := a.Header.Get(proxy.RunIDHeader)
	br := bufio.NewReader(a.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	lossy.Arm(h.keys.Prefix+"cancelled:{", testenv.RedisRequestLost, 100)
	c := send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: another question"}]}`,
		map[string]string{proxy.SessionHeader: "s"})
	if c.status != http.StatusOK || lossy.Fired() == 0 {
		t.Fatalf("C: %d %s, %d cancel writes lost; want 200 and its cancel lost", c.status, c.body, lossy.Fired())
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("A, replaced by C on its own process, did not end as superseded: ...%s", rest[max(0, len(rest)-300):])
	}
	if run := h.run(u.ID, aRun); run.SettleSource.String != holds.SourceCancel || run.OutTok >= chunks {
		t.Fatalf("A = %+v, want settled by cancel with its partial output", run)
	}
}
