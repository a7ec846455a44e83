package testenv

import (
	"net"
	"sync/atomic"
)

// StallingConn is a connection that, once Stalled is set, sends nothing more: every call then
// waits for a reply that never comes, as against a server that has hung (a full disk's fsync,
// a paused process, a network that drops packets). Its reads still end at their deadline.
type StallingConn struct {
	net.Conn
	Stalled *atomic.Bool
}

func (c *StallingConn) Write(b []byte) (int, error) {
	if c.Stalled.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}
