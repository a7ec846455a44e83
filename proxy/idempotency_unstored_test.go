package proxy_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/proxy"
)

// failingWrites fails, while on, every write to Redis that carries marker, as a Redis blip
// would fail it.
type failingWrites struct {
	marker []byte
	on     atomic.Bool
}

type failingWritesConn struct {
	net.Conn
	f *failingWrites
}

func (c *failingWritesConn) Write(b []byte) (int, error) {
	if c.f.on.Load() && bytes.Contains(b, c.f.marker) {
		return 0, errors.New("redis blip")
	}
	return c.Conn.Write(b)
}

// TestIdemAnswerNotStoredIsNotRunAgain: an Idempotency-Key attempt answered 200 whose answer
// could not be stored (Redis failed that one write; the key's record, with its body, was
// written) pinned the key all the same: its retry must not run and be charged again. The
// retry found the record without an answer and took the attempt for one that had not pinned;
// it now reads the attempt's row, as it does when the record itself was lost, and answers
// 409 idempotent_response_lost.
func TestIdemAnswerNotStoredIsNotRunAgain(t *testing.T) {
	blip := &failingWrites{marker: []byte("\r\nctype\r\n")} // only the stored answer has this field
	h := newHarnessOn(t, harnessSetup{
		redisDialer:     wrappedDialer(func(c net.Conn) net.Conn { return &failingWritesConn{Conn: c, f: blip} }),
		contextTimeouts: true,
	}, nil)
	u, key := h.user("standard")
	idem := map[string]string{"Idempotency-Key": "unstored-1"}

	blip.on.Store(true)
	first := send(h.gw.URL, key, chatBody, idem)
	if first.status != http.StatusOK {
		t.Fatalf("first attempt: %d %s", first.status, first.body)
	}
	h.settled()
	blip.on.Store(false)

	h.postRefused(t, key, "/v1/chat/completions", chatBody, idem, http.StatusConflict, "idempotent_response_lost")
	h.expectCharges(u.ID, []string{first.header.Get(proxy.RunIDHeader)})
}
