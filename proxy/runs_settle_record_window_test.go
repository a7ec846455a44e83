package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/tollgate/tollgate/holds"
)

// TestSettleBetweenACallsTallyAndItsRecordWaitsForTheRecord: README, "while a call of the run
// is in flight, POST …/settle gets 409 run_busy". A call's end writes its tally (which gives
// its reservation back) and then its record on the run's row. After a Redis restart without
// persistence the tally has only the calls made since, the row the calls it recorded; a
// settle that came between the two writes (its rebuild wait over, the call too short for a
// heartbeat to have written its lease) found nothing in flight and charged the larger of the
// two records — the call alone, here — and the call's record then found its run settled: the
// run's first call was never charged.
func TestSettleBetweenACallsTallyAndItsRecordWaitsForTheRecord(t *testing.T) {
	h, gate := gatedHarness(t, nil)
	u, key := h.user("standard")
	run := map[string]string{"X-Run-Id": "task-record-window"}
	runID := firstRunCall(t, h, key, run, 5)
	ctx := context.Background()
	loseRunKeys(t, h, runID)
	// The restart was noticed lease_ttl ago: a settle no longer waits for the rebuild.
	if err := h.rdb.Set(ctx, h.keys.Lost(runID), 0, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	second, tx, letGo := streamWithRunRowLocked(t, h, gate, key, run, runID)
	defer second.Body.Close()
	defer tx.Rollback()
	letGo()
	settleInRecordWindow(t, h, key, "task-record-window", runID, second, tx)
	r := h.run(u.ID, runID)
	if r.State != holds.StateSettled || r.OutTok != 45 || r.Calls != 2 {
		t.Fatalf("run settled as %s with %d output tokens over %d calls, charged %d µUSD; want both calls (45 output tokens)",
			r.State, r.OutTok, r.Calls, r.ChargedMicro)
	}
}

// settleInRecordWindow settles the named run (name, runID) while its call answered by second
// has written its tally and waits to record itself on the run's row, which tx holds locked: it
// reads the call's answer, sends the settle once the call's record waits, lets the record go
// (committing tx) once the settle has answered or waits on the row, and settles again after
// the run's rebuild if the first settle was told 409 run_busy. Any other answer fails t.
func settleInRecordWindow(t *testing.T, h *harness, key, name, runID string, second *http.Response, tx *sqlx.Tx) {
	t.Helper()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = io.Copy(io.Discard, bufio.NewReader(second.Body))
	}()
	// Tallied (its reservation given back), its record waiting.
	waitRunHoldsStatements(t, h, 1)

	settled := make(chan string, 1)
	go func() {
		resp := h.post(key, "/v1/runs/"+name+"/settle", "", nil)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		settled <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	// Either answered at once, or its settlement waits for the row behind the record.
	var got string
	for got == "" {
		select {
		case got = <-settled:
		case <-time.After(5 * time.Millisecond):
			var n int
			if err := h.db.Get(&n, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
				WHERE ID <> CONNECTION_ID() AND DB = DATABASE() AND INFO LIKE '%run_holds%' AND INFO NOT LIKE '%PROCESSLIST%'`); err != nil {
				t.Fatal(err)
			}
			if n >= 2 {
				got = "waiting"
			}
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got == "waiting" {
		got = <-settled
	}
	<-ended
	h.settled()
	if !strings.HasPrefix(got, "200 ") {
		if !strings.HasPrefix(got, "409 ") || !strings.Contains(got, "run_busy") {
			t.Fatalf("settle between the call's tally and its record: %s", got)
		}
		if status, body := settleAfterRebuild(h, key, name, runID); status != http.StatusOK {
			t.Fatalf("settle: %d %s", status, body)
		}
	}
}
