package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/monolock-dev/monolock"
)

// The scripted server behaviours, one per connection the client under test
// makes, in this order. Each reads the client's ACQUIRE first.
var scenarios = []struct {
	name string
	play func(p *player) error
}{
	{"grant, then silence: the client gives up before the server would drop it, with one heartbeat in flight", (*player).grantThenSilence},
	{"slow replies: never a second heartbeat before the reply to the first", (*player).slowReplies},
	{"ERROR 0x01 while queued: the client reconnects at once", (*player).shutdownWhileQueued},
	{"a promotion push while a heartbeat is in flight confirms nothing", (*player).pushDuringHeartbeat},
	{"ERROR 0x05, an unknown server condition: the client reconnects", (*player).unknownTemporary},
	{"garbage bytes: the client closes the connection", (*player).garbage},
	{"ERROR 0x1f, an unknown client error: the client does not retry", (*player).unknownPermanent},
}

// player serves one connection of the client under test.
type player struct {
	l       net.Listener
	conn    net.Conn
	lease   time.Duration
	arrived time.Time // when the ACQUIRE arrived
	token   uint64

	reaccepted bool // the scenario accepted the next one's connection
}

func clientMain(args []string, w io.Writer) int {
	fs := flag.NewFlagSet("monolock-conform client", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7075", "`address` to listen on")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		fmt.Fprintln(w, "usage: monolock-conform client [-listen ADDR]")
		return 2
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	defer l.Close()
	fmt.Fprintf(w, "listening on %s: point the client under test at it (lock \"conform\", any lease, retrying)\n", l.Addr())
	return playClient(l, w)
}

func playClient(l net.Listener, w io.Writer) int {
	r := &report{w: w}
	p := &player{l: l, token: uint64(time.Now().UnixNano())}
	for _, sc := range scenarios {
		var err error
		if !p.reaccepted { // a scenario that checks a reconnection accepts it itself
			err = p.accept(30 * time.Second)
		}
		p.reaccepted = false
		if err == nil {
			err = sc.play(p)
		}
		if p.conn != nil && !p.reaccepted {
			p.conn.Close()
		}
		r.check(sc.name, err)
	}
	return r.done()
}

// accept waits for the next connection and reads its ACQUIRE.
func (p *player) accept(within time.Duration) error {
	p.conn = nil
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		c, err := p.l.Accept()
		got <- accepted{c, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			return a.err
		}
		p.conn = a.c
	case <-time.After(within):
		p.l.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Now())
		<-got
		p.l.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Time{})
		return fmt.Errorf("no connection from the client within %v", within)
	}
	f, err := p.read(10 * time.Second)
	if err != nil {
		return fmt.Errorf("reading the ACQUIRE: %v", err)
	}
	if f.Type != monolock.TypeAcquire {
		return fmt.Errorf("first frame is type 0x%02x, not ACQUIRE", f.Type)
	}
	p.arrived = time.Now()
	p.lease = time.Duration(f.LeaseMS) * time.Millisecond
	return nil
}

func (p *player) read(d time.Duration) (monolock.Frame, error) {
	p.conn.SetReadDeadline(time.Now().Add(d))
	return monolock.ReadFrame(p.conn)
}

func (p *player) send(f monolock.Frame) error {
	b, _ := f.AppendBinary(nil)
	p.conn.SetWriteDeadline(time.Now().Add(wait))
	_, err := p.conn.Write(b)
	return err
}

func (p *player) acquired() monolock.Frame {
	p.token++
	return monolock.Frame{Type: monolock.TypeAcquired, Token: p.token}
}

var waitingFrame = monolock.Frame{Type: monolock.TypeWaiting}

// silentUntilClose reads what the client sends, answering nothing, until it
// closes; it counts the heartbeats. A server would drop the session at
// lastSeen + lease: the client must have closed before that.
func (p *player) silentUntilClose(lastSeen time.Time) (heartbeats int, err error) {
	dropAt := lastSeen.Add(p.lease)
	for {
		f, err := p.read(time.Until(dropAt.Add(2 * time.Second)))
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return heartbeats, fmt.Errorf("still claiming %v after a server would have dropped it", time.Since(dropAt).Round(time.Millisecond))
			}
			if late := time.Since(dropAt); late > 0 {
				return heartbeats, fmt.Errorf("closed %v after a server would have dropped it and granted the lock again", late.Round(time.Millisecond))
			}
			return heartbeats, nil
		}
		if f.Type == monolock.TypeHeartbeat {
			heartbeats++
		}
	}
}

func (p *player) grantThenSilence() error {
	if err := p.send(p.acquired()); err != nil {
		return err
	}
	heartbeats, err := p.silentUntilClose(p.arrived)
	if err == nil && heartbeats > 1 {
		err = fmt.Errorf("%d heartbeats sent with none answered: more than one in flight", heartbeats)
	}
	return err
}

func (p *player) slowReplies() error {
	if err := p.send(waitingFrame); err != nil {
		return err
	}
	delay := p.lease / 3 // slower than the heartbeat interval of lease/4
	for range 3 {
		f, err := p.read(p.lease)
		if err != nil || f.Type != monolock.TypeHeartbeat {
			return fmt.Errorf("want a heartbeat, got %v", err)
		}
		if f, err := p.read(delay); err == nil {
			return fmt.Errorf("a second frame (type 0x%02x) before the heartbeat was answered", f.Type)
		}
		if err := p.send(waitingFrame); err != nil {
			return err
		}
	}
	return nil
}

func (p *player) shutdownWhileQueued() error {
	if err := p.send(waitingFrame); err != nil {
		return err
	}
	p.send(monolock.Frame{Type: monolock.TypeError, Code: monolock.CodeShuttingDown, Reason: "server shutting down"})
	p.conn.Close()
	// The next connection must come at once; it is the next scenario's.
	if err := p.accept(time.Second); err != nil {
		return fmt.Errorf("after ERROR 0x01: %v", err)
	}
	p.reaccepted = true
	return nil
}

func (p *player) pushDuringHeartbeat() error {
	if err := p.send(waitingFrame); err != nil {
		return err
	}
	f, err := p.read(p.lease)
	if err != nil || f.Type != monolock.TypeHeartbeat {
		return fmt.Errorf("want a heartbeat, got %v", err)
	}
	// The heartbeat stays unanswered; the push comes instead.
	if err := p.send(p.acquired()); err != nil {
		return err
	}
	// The server last heard the ACQUIRE: a client that took the push as the
	// heartbeat's reply believes until the heartbeat's send + 0.8 lease.
	_, err = p.silentUntilClose(p.arrived)
	return err
}

func (p *player) unknownTemporary() error {
	p.send(monolock.Frame{Type: monolock.TypeError, Code: 0x05})
	p.conn.Close()
	// The reconnection is the next scenario's accept (within its 30s).
	return nil
}

func (p *player) garbage() error {
	if err := p.send(waitingFrame); err != nil {
		return err
	}
	p.conn.SetWriteDeadline(time.Now().Add(wait))
	p.conn.Write([]byte{0x7f, 0x00, 0x00})
	for end := time.Now().Add(2 * time.Second); ; {
		if _, err := p.read(time.Until(end)); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return errors.New("the connection is still open 2s after garbage")
			}
			return nil
		}
	}
}

func (p *player) unknownPermanent() error {
	p.send(monolock.Frame{Type: monolock.TypeError, Code: 0x1f})
	p.conn.Close()
	p.conn = nil
	if err := p.accept(3 * time.Second); err == nil {
		return errors.New("the client connected again after a client-error code")
	}
	return nil
}
