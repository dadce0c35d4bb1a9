package main

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/monolock-dev/monolock"
)

// heldConn is run's connection to the server. After a loss the client
// closes its connection a lease later at most; but a loss is only what the
// client concluded (no confirmation within 0.8 of the lease), and a server
// that was paused, or whose answers were lost, may still hold the lock for
// it. Closing would turn that into a release while COMMAND's group, which
// may ignore SIGTERM until -grace, runs on. So run keeps the connection
// open, and sends heartbeats on it, until the group is gone: the lock goes
// to another only if the server itself ended the session.
type heldConn struct {
	net.Conn
	mu       sync.Mutex
	holding  bool // granted, and run not done: Close is put off
	finished bool // run is done with it: Close closes
	kept     bool // the client closed it while holding
}

// hold starts putting off the client's Close: from the grant on. Before
// it, a Close must close at once, since it is how the client ends a wait
// (-wait, a signal) without waiting for a read deadline.
func (c *heldConn) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// Close is the client's: while holding it is put off until finish, and
// meanwhile the answers to run's heartbeats are read and dropped, so that
// they never fill the socket.
func (c *heldConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.holding || c.finished {
		return c.Conn.Close()
	}
	if !c.kept {
		c.kept = true
		go func() {
			c.Conn.SetReadDeadline(time.Time{})
			io.Copy(io.Discard, c.Conn)
		}()
	}
	return nil
}

// finish closes the connection for good.
func (c *heldConn) finish() {
	c.mu.Lock()
	c.finished = true
	c.mu.Unlock()
	c.Conn.Close()
}

// heartbeat sends a HEARTBEAT every quarter lease until a write fails or
// stop is closed. The client sends nothing after a loss, so these writes
// are the only ones.
func (c *heldConn) heartbeat(lease time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(lease / 4)
	defer t.Stop()
	for {
		c.Conn.SetWriteDeadline(time.Now().Add(lease))
		if _, err := c.Conn.Write([]byte{monolock.TypeHeartbeat}); err != nil {
			return
		}
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

// heldDialer dials through d and keeps the connection it made.
type heldDialer struct {
	d     monolock.Dialer
	conn  *heldConn
	dials atomic.Int32 // begun
}

func (h *heldDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	h.dials.Add(1)
	conn, err := h.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	h.conn = &heldConn{Conn: conn}
	return h.conn, nil
}

// finish closes the connection, if one was dialled.
func (h *heldDialer) finish() {
	if h.conn != nil {
		h.conn.finish()
	}
}
