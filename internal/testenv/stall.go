package testenv

import (
	"bytes"
	"net"
	"sync/atomic"
	"time"
)

// StallingConn is a connection that, once Stalled is set, sends nothing more: every call then
// waits for a reply that never comes, as against a server that has hung (a full disk's fsync,
// a paused process, a network that drops packets). Its reads still end at their deadline.
type StallingConn struct {
	net.Conn
	Stalled *atomic.Bool
	// Swallowed, if set, is told of each write swallowed (without blocking): a test waits
	// for a request to be lost instead of for a while.
	Swallowed chan<- struct{}
}

func (c *StallingConn) Write(b []byte) (int, error) {
	if c.Stalled.Load() {
		select {
		case c.Swallowed <- struct{}{}:
		default:
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// HeldWrite holds back the first write containing its marker, through any HoldingConn of it,
// until Let: a test sees the moment that request is on its way (Held) and decides when the
// server gets it.
type HeldWrite struct {
	marker []byte
	armed  atomic.Bool
	held   chan struct{}
	let    chan struct{}
}

// NewHeldWrite returns a HeldWrite armed for the first write containing marker.
func NewHeldWrite(marker string) *HeldWrite {
	h := &HeldWrite{marker: []byte(marker), held: make(chan struct{}), let: make(chan struct{})}
	h.armed.Store(true)
	return h
}

// Held is closed once the marked write is being held.
func (h *HeldWrite) Held() <-chan struct{} { return h.held }

// Let sends the held write on.
func (h *HeldWrite) Let() { close(h.let) }

// HoldingConn is a connection whose writes pass but for the one its HeldWrite holds. Its
// writes ignore deadlines, as a request already on the wire is not recalled by its caller's:
// the held write reaches the server when let go, however late.
type HoldingConn struct {
	net.Conn
	Hold *HeldWrite
}

func (c *HoldingConn) SetWriteDeadline(time.Time) error { return nil }

func (c *HoldingConn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }

func (c *HoldingConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.Hold.marker) && c.Hold.armed.CompareAndSwap(true, false) {
		close(c.Hold.held)
		<-c.Hold.let
	}
	return c.Conn.Write(b)
}
