package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/monolock-dev/monolock"
)

// wait bounds how long a check waits for something that should be at once.
const wait = 5 * time.Second

// sess is one connection to the server under test.
type sess struct{ net.Conn }

func dialSess(addr string) (*sess, error) {
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		return nil, err
	}
	return &sess{c}, nil
}

func (s *sess) send(frames ...monolock.Frame) error {
	var b []byte
	for _, f := range frames {
		b, _ = f.AppendBinary(b)
	}
	return s.sendBytes(b)
}

func (s *sess) sendBytes(b []byte) error {
	s.SetWriteDeadline(time.Now().Add(wait))
	_, err := s.Write(b)
	return err
}

func (s *sess) next(d time.Duration) (monolock.Frame, error) {
	s.SetReadDeadline(time.Now().Add(d))
	return monolock.ReadFrame(s)
}

// expect reads the next frame and checks its type (and code, for ERROR).
func (s *sess) expect(typ byte, code monolock.Code) (monolock.Frame, error) {
	f, err := s.next(wait)
	switch {
	case err != nil:
		return f, fmt.Errorf("want %s, got %v", typeName(typ, code), err)
	case f.Type != typ || (typ == monolock.TypeError && f.Code != code):
		return f, fmt.Errorf("want %s, got %s", typeName(typ, code), typeName(f.Type, f.Code))
	}
	return f, nil
}

// expectError reads an ERROR with code, then the end of the connection.
func (s *sess) expectError(code monolock.Code) error {
	if _, err := s.expect(monolock.TypeError, code); err != nil {
		return err
	}
	return s.expectClosed(wait)
}

func (s *sess) expectClosed(d time.Duration) error {
	f, err := s.next(d)
	if err == nil {
		return fmt.Errorf("want the connection closed, got %s", typeName(f.Type, f.Code))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("connection still open after %v", d)
	}
	return nil
}

func typeName(typ byte, code monolock.Code) string {
	switch typ {
	case monolock.TypeWaiting:
		return "WAITING"
	case monolock.TypeAcquired:
		return "ACQUIRED"
	case monolock.TypeError:
		return fmt.Sprintf("ERROR 0x%02x", uint8(code))
	}
	return fmt.Sprintf("type 0x%02x", typ)
}

func acquireFrame(name string, lease time.Duration) monolock.Frame {
	return monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(lease / time.Millisecond), Name: name}
}

var heartbeat = monolock.Frame{Type: monolock.TypeHeartbeat}

// serverChecker runs the checks against one server.
type serverChecker struct {
	addr      string
	ioTimeout time.Duration
	prefix    string // makes this run's lock names its own
	n         int
	conns     []*sess
}

func (c *serverChecker) name() string {
	c.n++
	return c.prefix + strconv.Itoa(c.n)
}

// open dials and sends ACQUIRE for name, and returns the first answer.
func (c *serverChecker) open(name string, lease time.Duration) (*sess, monolock.Frame, error) {
	s, err := dialSess(c.addr)
	if err != nil {
		return nil, monolock.Frame{}, err
	}
	c.conns = append(c.conns, s)
	if err := s.send(acquireFrame(name, lease)); err != nil {
		return s, monolock.Frame{}, err
	}
	f, err := s.next(wait)
	return s, f, err
}

func (c *serverChecker) holderAndWaiters(n int) (name string, holder *sess, token uint64, waiters []*sess, err error) {
	name = c.name()
	holder, f, err := c.open(name, time.Minute)
	if err == nil && f.Type != monolock.TypeAcquired {
		err = fmt.Errorf("ACQUIRE on a free lock answered %s", typeName(f.Type, f.Code))
	}
	if err != nil {
		return
	}
	token = f.Token
	for range n {
		w, f, err2 := c.open(name, time.Minute)
		if err2 == nil && f.Type != monolock.TypeWaiting {
			err2 = fmt.Errorf("ACQUIRE on a held lock answered %s", typeName(f.Type, f.Code))
		}
		if err2 != nil {
			return name, holder, token, waiters, err2
		}
		waiters = append(waiters, w)
	}
	return
}

func (c *serverChecker) closeAll() {
	for _, s := range c.conns {
		s.Close()
	}
	c.conns = nil
}

func serverMain(args []string, w io.Writer) int {
	fs := flag.NewFlagSet("monolock-conform server", flag.ContinueOnError)
	ioTimeout := fs.Duration("io-timeout", monolock.DefaultIOTimeout, "the server's io-timeout, to bound the waits for it")
	if fs.Parse(args) != nil || fs.NArg() != 1 {
		fmt.Fprintln(w, "usage: monolock-conform server [-io-timeout D] ADDR")
		return 2
	}
	c := &serverChecker{addr: fs.Arg(0), ioTimeout: *ioTimeout,
		prefix: fmt.Sprintf("conform-%d-", time.Now().UnixNano())}
	r := &report{w: w}
	for _, check := range c.checks() {
		r.check(check.name, check.run())
		c.closeAll()
	}
	return r.done()
}

type check struct {
	name string
	run  func() error
}

func (c *serverChecker) checks() []check {
	errorCheck := func(stream []byte, code monolock.Code) func() error {
		return func() error {
			s, err := dialSess(c.addr)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, s)
			s.sendBytes(stream)
			for { // the answers to the valid frames first, then the ERROR
				f, err := s.next(wait)
				if err != nil {
					return fmt.Errorf("want ERROR 0x%02x, got %v", uint8(code), err)
				}
				if f.Type == monolock.TypeError {
					if f.Code != code {
						return fmt.Errorf("want ERROR 0x%02x, got ERROR 0x%02x", uint8(code), uint8(f.Code))
					}
					return s.expectClosed(wait)
				}
			}
		}
	}
	acq := func(version byte, leaseMS uint32, nameLen int, name string) []byte {
		b := []byte{monolock.TypeAcquire, version, byte(leaseMS >> 24), byte(leaseMS >> 16), byte(leaseMS >> 8), byte(leaseMS), byte(nameLen >> 8), byte(nameLen)}
		return append(b, name...)
	}
	var lastToken uint64
	return []check{
		{"ACQUIRE on a free lock: ACQUIRED with a token", func() error {
			_, f, err := c.open(c.name(), time.Minute)
			if err == nil && (f.Type != monolock.TypeAcquired || f.Token == 0) {
				err = fmt.Errorf("got %s with token %d", typeName(f.Type, f.Code), f.Token)
			}
			return err
		}},
		{"ACQUIRE on a held lock: WAITING", func() error {
			_, _, _, _, err := c.holderAndWaiters(1)
			return err
		}},
		{"HEARTBEAT answered with the state: ACQUIRED with the same token, WAITING", func() error {
			_, holder, token, waiters, err := c.holderAndWaiters(1)
			if err != nil {
				return err
			}
			for range 3 {
				holder.send(heartbeat)
				if f, err := holder.expect(monolock.TypeAcquired, 0); err != nil || f.Token != token {
					return fmt.Errorf("holder's heartbeat: %v (token %d, granted %d)", err, f.Token, token)
				}
				waiters[0].send(heartbeat)
				if _, err := waiters[0].expect(monolock.TypeWaiting, 0); err != nil {
					return fmt.Errorf("waiter's heartbeat: %v", err)
				}
			}
			return nil
		}},
		{"closing the holder pushes ACQUIRED to the waiter, no heartbeat needed, with a larger token", func() error {
			_, holder, token, waiters, err := c.holderAndWaiters(1)
			if err != nil {
				return err
			}
			holder.Close()
			f, err := waiters[0].expect(monolock.TypeAcquired, 0)
			if err == nil && f.Token <= token {
				err = fmt.Errorf("token %d after %d", f.Token, token)
			}
			if err == nil {
				if f, err2 := waiters[0].next(200 * time.Millisecond); err2 == nil {
					err = fmt.Errorf("a second unsolicited %s after the push", typeName(f.Type, f.Code))
				}
			}
			return err
		}},
		{"waiters are promoted in FIFO order; one leaving from the middle keeps the order", func() error {
			_, holder, _, waiters, err := c.holderAndWaiters(4)
			if err != nil {
				return err
			}
			waiters[1].Close()
			prev := holder
			for _, i := range []int{0, 2, 3} {
				prev.Close()
				if _, err := waiters[i].expect(monolock.TypeAcquired, 0); err != nil {
					return fmt.Errorf("waiter %d (in the order they queued): %v", i+1, err)
				}
				prev = waiters[i]
			}
			return nil
		}},
		{"a holder silent for longer than its lease is dropped, no sooner, and its waiter promoted", func() error {
			const lease = 300 * time.Millisecond
			name := c.name()
			start := time.Now()
			holder, f, err := c.open(name, lease)
			if err != nil || f.Type != monolock.TypeAcquired {
				return fmt.Errorf("holder: %v %s", err, typeName(f.Type, f.Code))
			}
			waiter, f, err := c.open(name, time.Minute)
			if err != nil || f.Type != monolock.TypeWaiting {
				return fmt.Errorf("waiter: %v %s", err, typeName(f.Type, f.Code))
			}
			if _, err := waiter.expect(monolock.TypeAcquired, 0); err != nil {
				return err
			}
			if d := time.Since(start); d < lease {
				return fmt.Errorf("promoted after %v, before the holder's lease of %v", d, lease)
			}
			return holder.expectClosed(wait)
		}},
		{"a waiter silent for longer than its lease is dropped", func() error {
			name, _, _, _, err := c.holderAndWaiters(0)
			if err != nil {
				return err
			}
			start := time.Now()
			w, f, err := c.open(name, 300*time.Millisecond)
			if err != nil || f.Type != monolock.TypeWaiting {
				return fmt.Errorf("waiter: %v %s", err, typeName(f.Type, f.Code))
			}
			if err := w.expectClosed(wait); err != nil {
				return err
			}
			if d := time.Since(start); d < 300*time.Millisecond {
				return fmt.Errorf("dropped after %v, before its lease", d)
			}
			return nil
		}},
		{"heartbeats keep a short lease alive for many leases", func() error {
			const lease = 200 * time.Millisecond
			s, f, err := c.open(c.name(), lease)
			if err != nil || f.Type != monolock.TypeAcquired {
				return fmt.Errorf("%v %s", err, typeName(f.Type, f.Code))
			}
			for end := time.Now().Add(8 * lease); time.Now().Before(end); {
				time.Sleep(lease / 8)
				s.send(heartbeat)
				if _, err := s.expect(monolock.TypeAcquired, 0); err != nil {
					return err
				}
			}
			return nil
		}},
		{"a connection that sends nothing is closed after the io-timeout", func() error {
			s, err := dialSess(c.addr)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, s)
			return s.expectClosed(c.ioTimeout + wait)
		}},
		{"a half-sent frame is closed after the io-timeout", func() error {
			s, err := dialSess(c.addr)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, s)
			s.sendBytes([]byte{monolock.TypeAcquire, 1, 0, 0})
			return s.expectClosed(c.ioTimeout + wait)
		}},
		{"names are raw bytes: case, NUL, slash and combining characters make distinct locks", func() error {
			for _, suffix := range []string{"a", "A", "a\x00", "a/b", "é", "e\u0301", " a"} {
				if _, f, err := c.open(c.prefix+"raw-"+suffix, time.Minute); err != nil || f.Type != monolock.TypeAcquired {
					return fmt.Errorf("%q: %v %s", suffix, err, typeName(f.Type, f.Code))
				}
			}
			return nil
		}},
		{"a 255-byte name of multi-byte characters is accepted", func() error {
			name := c.prefix + strings.Repeat("é", (255-len(c.prefix))/2)
			name += strings.Repeat("x", 255-len(name))
			_, f, err := c.open(name, time.Minute)
			if err == nil && f.Type != monolock.TypeAcquired {
				err = fmt.Errorf("got %s", typeName(f.Type, f.Code))
			}
			return err
		}},
		{"frames split byte by byte are read whole", func() error {
			s, err := dialSess(c.addr)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, s)
			b, _ := acquireFrame(c.name(), time.Minute).AppendBinary(nil)
			for _, x := range append(b, monolock.TypeHeartbeat) {
				s.sendBytes([]byte{x})
				time.Sleep(time.Millisecond)
			}
			if _, err := s.expect(monolock.TypeAcquired, 0); err != nil {
				return err
			}
			_, err = s.expect(monolock.TypeAcquired, 0)
			return err
		}},
		{"tokens strictly increase across grants of every lock", func() error {
			for range 5 {
				_, f, err := c.open(c.name(), time.Minute)
				if err != nil || f.Type != monolock.TypeAcquired {
					return fmt.Errorf("%v %s", err, typeName(f.Type, f.Code))
				}
				if f.Token <= lastToken {
					return fmt.Errorf("token %d after %d", f.Token, lastToken)
				}
				lastToken = f.Token
			}
			return nil
		}},
		{"0x10 unsupported version, before anything else", errorCheck(acq(2, 0, 0, ""), monolock.CodeUnsupportedVersion)},
		{"0x11 HEARTBEAT before ACQUIRE", errorCheck([]byte{monolock.TypeHeartbeat}, monolock.CodeAcquireFirst)},
		{"0x12 a second ACQUIRE", errorCheck(append(acq(1, 60000, 3, c.prefix[len(c.prefix)-3:]), acq(1, 60000, 1, "x")...), monolock.CodeDuplicateAcquire)},
		{"0x13 an unknown type byte", errorCheck([]byte{0x7f}, monolock.CodeUnknownType)},
		{"0x13 a server's own type sent by a client", errorCheck([]byte{monolock.TypeWaiting}, monolock.CodeUnknownType)},
		{"0x14 an empty name", errorCheck(acq(1, 1000, 0, ""), monolock.CodeEmptyName)},
		{"0x15 a 256-byte name", errorCheck(acq(1, 1000, 256, strings.Repeat("n", 256)), monolock.CodeNameTooLong)},
		{"0x15 name_len 65535 without the name", errorCheck(acq(1, 1000, 65535, ""), monolock.CodeNameTooLong)},
		{"0x16 a name that is not UTF-8", errorCheck(acq(1, 1000, 2, "\xc3\x28"), monolock.CodeInvalidUTF8)},
		{"0x17 lease 0, checked before the name", errorCheck(acq(1, 0, 0, ""), monolock.CodeInvalidLease)},
		{"an ERROR sent to the holder promotes its waiter at once", func() error {
			_, holder, _, waiters, err := c.holderAndWaiters(1)
			if err != nil {
				return err
			}
			holder.sendBytes([]byte{0x7f})
			if err := holder.expectError(monolock.CodeUnknownType); err != nil {
				return err
			}
			_, err = waiters[0].expect(monolock.TypeAcquired, 0)
			return err
		}},
	}
}
