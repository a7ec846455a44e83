package proxy_test

import (
	"net/http"
	"testing"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
)

// TestRefusedSettleLogsTheNameTheCallerAsked: a refused POST /v1/runs/{id}/settle of a run
// named by its X-Run-Id logged only run_id, the gateway's hash of the user and that name
// (x_…), and a settle's answer carries no request id: an agent's operator quoting the name it
// settled ("agent:42") could not find the line that said why without computing the hash. Every
// line of a settle now carries asked_id, the id as the caller sent it (percent-escapes undone,
// as the lookup undoes them), beside run_id.
func TestRefusedSettleLogsTheNameTheCallerAsked(t *testing.T) {
	h, gate, logs := gatedObservedHarness(t, config.Upstream{Name: "gate-openai", Kind: "openai", Models: []string{"*"}})
	// Before the harness's cleanup, which waits for the gated call: an assertion that fails
	// while it waits at the gate ends the test at once, not when upstream_timeout ends the call.
	t.Cleanup(func() { gate.open("busy") })
	_, key := h.user("standard")

	// 409 run_busy: a call of the run is in flight.
	done := make(chan answer, 1)
	go func() {
		done <- send(h.gw.URL, key, chatBody, map[string]string{"X-Run-Id": "agent:42", "X-Test-Gate": "busy"})
	}()
	gate.await(t, "busy", 1)
	for _, c := range []struct {
		path, name string
		status     int
		code       string
	}{
		{"agent%3A42", "agent:42", http.StatusConflict, "run_busy"},
		{"agent:43", "agent:43", http.StatusNotFound, "run_not_found"},
	} {
		logs.TakeAll()
		status, body := h.settleRun(key, c.path)
		if status != c.status || errorCode(t, body) != c.code {
			t.Fatalf("settle %s: %d %s, want %d %s", c.path, status, body, c.status, c.code)
		}
		lines := logs.FilterMessage("request refused").FilterField(zap.String("code", c.code)).All()
		if len(lines) != 1 {
			t.Fatalf("settle %s: %d 'request refused' lines with code %s, want 1 (all: %v)", c.path, len(lines), c.code, logs.All())
		}
		f := lines[0].ContextMap()
		if f["asked_id"] != c.name || f["run_id"] == nil || f["user_id"] == nil {
			t.Errorf("settle %s refused: line has asked_id %v run_id %v user_id %v; want asked_id %q beside the run and user",
				c.path, f["asked_id"], f["run_id"], f["user_id"], c.name)
		}
	}
	gate.open("busy")
	if a := <-done; a.status != http.StatusOK {
		t.Fatalf("the run's call: %d %v %s", a.status, a.err, a.body)
	}
	h.settled()
	if status, body := h.settleRun(key, "agent:42"); status != http.StatusOK {
		t.Fatalf("settle once the call ended: %d %s", status, body)
	}
}
