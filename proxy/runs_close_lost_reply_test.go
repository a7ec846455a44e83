package proxy_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// closeReplyLoser cuts, once armed, every connection right after it sends a run's close
// (the only script that names both a run's budget hash and its lease): Redis runs the close,
// and its reply never reaches the gateway.
type closeReplyLoser struct {
	armed atomic.Bool
	cut   atomic.Int64
}

type closeReplyLoserConn struct {
	net.Conn
	l *closeReplyLoser
}

func (c *closeReplyLoserConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.l.armed.Load() && bytes.Contains(b, []byte("billing:runbudget:{")) && bytes.Contains(b, []byte("lease:{")) {
		c.l.cut.Add(1)
		_ = c.Conn.Close()
	}
	return n, err
}

// TestSettleWhoseCloseReplyWasLostReopensTheRun: a client's settle closes its run in Redis
// (CloseRun) before reading the tally. When the close landed but its reply was lost, the
// settle answers 503 and settles nothing — and the run must not stay closed: it did, until
// the close's mark lapsed (the longest call, minutes), and every call of the unsettled run was
// meanwhile refused 409 run_settled, an answer an agent takes as final.
func TestSettleWhoseCloseReplyWasLostReopensTheRun(t *testing.T) {
	loser := &closeReplyLoser{}
	h := newHarnessOn(t, harnessSetup{redisDialer: wrappedDialer(func(c net.Conn) net.Conn {
		return &closeReplyLoserConn{Conn: c, l: loser}
	})}, nil)
	u, key := h.user("standard")
	hdr := map[string]string{"X-Run-Id": "task-close-lost"}
	first, _ := h.postOK(t, key, "/v1/chat/completions", chatBody, hdr) // first call
	runID := first.Header.Get("X-Tollgate-Run-Id")
	h.settled()

	// Another run settled first loads the close script into Redis's cache, as any running
	// gateway has it: the close then goes as EVALSHA and runs.
	warm := h.post(key, "/v1/chat/completions", chatBody, map[string]string{"X-Run-Id": "task-warm"})
	readAll(t, warm.Body)
	warm.Body.Close()
	h.settled()
	if status, body := h.settleRun(key, "task-warm"); status != http.StatusOK {
		t.Fatalf("settle of the warm-up run: %d %s", status, body)
	}

	loser.armed.Store(true)
	status, body := h.settleRun(key, "task-close-lost")
	loser.armed.Store(false)
	if loser.cut.Load() == 0 {
		t.Fatal("the run's close never reached Redis")
	}
	if status != http.StatusServiceUnavailable {
		t.Fatalf("settle whose close reply was lost: %d %s, want 503", status, body)
	}
	if r := h.run(u.ID, runID); r.State == "settled" {
		t.Fatalf("run settled although its settle answered 503: %+v", r)
	}

	h.postOK(t, key, "/v1/chat/completions", chatBody, hdr) // call of the unsettled run after a settle that failed
	h.settled()
	if status, body := h.settleRun(key, "task-close-lost"); status != http.StatusOK {
		t.Fatalf("settle: %d %s", status, body)
	}
}

// TestSettleWhoseCloseWasResentKnowsItsOwnClose: a settle's close of its run (CloseRun) runs
// in Redis and its reply is lost; go-redis sends the script again. Meanwhile another process
// wrote a lease on the run (a call of it that had stalled past its lease's life beats again).
// The resend found the run leased and answered busy: the settle was refused 409 run_busy,
// settled nothing, and left the run closed under its own mark, which nobody would reopen —
// the run's calls were refused 409 run_settled until the mark lapsed (the longest call). The
// resend now finds its own mark and reports the close, which is what happened.
func TestSettleWhoseCloseWasResentKnowsItsOwnClose(t *testing.T) {
	lose := disarmedReplyLoser("")
	h := newHarnessOn(t, harnessSetup{redisDialer: lose.dial}, nil)
	u, key := h.user("standard")
	// The first call also loads the close script into Redis (through a warm-up run's settle):
	// the close goes as EVALSHA and runs, rather than coming back NOSCRIPT.
	runID := firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-close-resent"}, 5)
	firstRunCall(t, h, key, map[string]string{"X-Run-Id": "task-close-warm"}, 5)
	if status, body := h.settleRun(key, "task-close-warm"); status != http.StatusOK {
		t.Fatalf("settle of the warm-up run: %d %s", status, body)
	}

	plain, _ := testenv.Redis(t)
	lease := h.keys.Lease(runID)
	lose.meanwhile = func() {
		if err := plain.Set(context.Background(), lease, "other-instance", time.Minute).Err(); err != nil {
			t.Errorf("lease of another process not written: %v", err)
		}
	}
	// Only the close names the run's lease here: no call of it is in flight.
	lose.marker = []byte(lease)
	lose.arm()
	status, body := h.settleRun(key, "task-close-resent")
	lose.ranAndLost(t)
	if status != http.StatusOK {
		t.Fatalf("settle whose close was resent: %d %s, want 200", status, body)
	}
	if r := h.run(u.ID, runID); r.State != holds.StateSettled {
		t.Fatalf("run %+v: want settled", r)
	}
}
