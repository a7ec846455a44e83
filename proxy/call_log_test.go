package proxy_test

import (
	"net/http"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestCallLogNamesItsRunOnce: a call's log lines carry its run id, and one only. A named run's
// call (X-Run-Id) learns its run id after its first fields are set; its lines carried both the
// id made up on arrival and the run's, two "run_id" keys in one JSON object, which log
// pipelines read as either.
func TestCallLogNamesItsRunOnce(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	h := newHarnessOn(t, harnessSetup{log: zap.New(core)}, nil)
	_, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-logged"}
	first := h.post(key, "/v1/chat/completions", chatBody, run)
	readAll(t, first.Body)
	first.Body.Close()
	if status, body := h.settleRun(key, "task-logged"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
	late := h.post(key, "/v1/chat/completions", chatBody, run) // refused: the run is settled
	readAll(t, late.Body)
	late.Body.Close()
	if late.StatusCode != http.StatusConflict {
		t.Fatalf("call on the settled run: %d, want 409", late.StatusCode)
	}

	refused := logs.FilterMessage("request refused").All()
	if len(refused) != 1 {
		t.Fatalf("%d 'request refused' lines, want 1", len(refused))
	}
	var ids []string
	for _, f := range refused[0].Context {
		if f.Key == "run_id" {
			ids = append(ids, f.String)
		}
	}
	if want := first.Header.Get("X-Tollgate-Run-Id"); len(ids) != 1 || ids[0] != want {
		t.Fatalf("refused call logged run ids %q, want just %q", ids, want)
	}
}
