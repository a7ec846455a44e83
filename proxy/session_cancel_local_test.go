package proxy_test

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/holds"
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
	aRun, br := runningSessionStream(t, h, key, "s")
	lossy.Arm(h.keys.Prefix+"cancelled:{", testenv.RedisRequestLost, 100)
	c := send(h.gw.URL, key, `{"model":"fake-gpt","messages":[{"role":"user","content":"C: another question"}]}`,
		map[string]string{proxy.SessionHeader: "s"})
	if c.status != http.StatusOK || lossy.Fired() == 0 {
		t.Fatalf("C: %d %s, %d cancel writes lost; want 200 and its cancel lost", c.status, c.body, lossy.Fired())
	}
	endsSuperseded(t, h, u, aRun, br, "replaced by C on its own process")
}

// runningSessionStream is a longSessionStream call in session sid read to its first event:
// the call is running upstream. It returns the call's run id and the stream to read on.
func runningSessionStream(t *testing.T, h *harness, key, sid string) (string, *bufio.Reader) {
	t.Helper()
	a := longSessionStream(t, h.gw.URL, key, sid)
	br := bufio.NewReader(a.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return a.Header.Get(proxy.RunIDHeader), br
}

// endsSuperseded reads the rest of a runningSessionStream call, replaced as what says, and checks
// it ended as superseded, not whole, and was settled by cancel at its partial output.
func endsSuperseded(t *testing.T, h *harness, u holds.User, runID string, br *bufio.Reader, what string) {
	t.Helper()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"code":"superseded"`) || strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("A, %s, did not end as superseded: ...%s", what, rest[max(0, len(rest)-300):])
	}
	if run := h.run(u.ID, runID); run.SettleSource.String != holds.SourceCancel || run.OutTok >= longSessionChunks {
		t.Fatalf("A = %+v, want settled by cancel with its partial output", run)
	}
}
