package proxy

import (
	"io"
	"net/http"
	"time"
)

// writeBound puts a deadline on writes to the caller (limits.client_write_timeout): the server
// sets none, since a stream may rightly last minutes, but a client that has stopped reading
// would otherwise block a write, and keep its call's hold, lease and reservation, for as long
// as it likes. The write then fails and the call ends as cancelled, charged what it used.
//
// The deadline is moved only once half of it has passed, not before every event: each move
// resets a runtime timer, and a stream writes thousands of events. So a stalled write fails
// after between half the timeout and the whole of it.
type writeBound struct {
	rc      *http.ResponseController
	timeout time.Duration
	setAt   time.Time
}

func (s *Server) boundWrites(rc *http.ResponseController) *writeBound {
	return &writeBound{rc: rc, timeout: s.cfg.Limits.ClientWriteTimeout}
}

// writePiece is the most written under one deadline: the timeout bounds a stall, not the
// time a large answer takes to reach a slow client that keeps reading.
const writePiece = 64 << 10

// write writes p to w in pieces, each with at least half the timeout, and returns how much
// of p was written, as io.Writer does.
func (b *writeBound) write(w io.Writer, p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), writePiece)
		b.next()
		m, err := w.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// next makes sure the coming write has at least half the timeout.
func (b *writeBound) next() {
	if now := time.Now(); now.Sub(b.setAt) >= b.timeout/2 {
		_ = b.rc.SetWriteDeadline(now.Add(b.timeout))
		b.setAt = now
	}
}
