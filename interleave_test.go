package monolock

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// stepConn is the server's end of an in-memory connection, with hooks that
// let a test run an administrator's action at one exact point of the
// session's goroutine (an interleaving the scheduler may always choose).
type stepConn struct {
	net.Conn
	name    string
	log     *writeLog
	onRead  func(b []byte) // after a read that returned bytes
	onSetRD func()
	onWrite func(b []byte, err error) // after a write, before it returns
}

func (c *stepConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.onRead != nil {
		c.onRead(b[:n])
	}
	return n, err
}

func (c *stepConn) SetReadDeadline(t time.Time) error {
	if c.onSetRD != nil {
		c.onSetRD()
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *stepConn) Write(b []byte) (int, error) {
	c.log.add(fmt.Sprintf("write %s: type 0x%02x % x", c.name, b[0], b))
	n, err := c.Conn.Write(b)
	if c.onWrite != nil {
		c.onWrite(b, err)
	}
	return n, err
}

type writeLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *writeLog) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *writeLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// stepListener is a pipeListener that hands the server stepConns.
type stepListener struct {
	*pipeListener
	log writeLog
}

func newStepListener() *stepListener { return &stepListener{pipeListener: newPipeListener()} }

func (l *stepListener) dial(name string) (client net.Conn, server *stepConn) {
	c, s := net.Pipe()
	hc := &stepConn{Conn: namedConn{s, pipeAddr(name)}, name: name, log: &l.log}
	go func() {
		select {
		case l.conns <- hc:
		case <-l.done:
			s.Close()
		}
	}()
	return c, hc
}

func sendAcquire(t *testing.T, c net.Conn, name string, lease time.Duration) {
	t.Helper()
	b, _ := acquire(name, lease).AppendBinary(nil)
	if _, err := c.Write(b); err != nil {
		t.Fatalf("write ACQUIRE: %v", err)
	}
}

func mustRead(t *testing.T, c net.Conn, typ byte) Frame {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	f, err := ReadFrame(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if f.Type != typ {
		t.Fatalf("got frame %+v, want type 0x%02x", f, typ)
	}
	return f
}

// readRest reads every frame until the connection ends.
func readRest(c net.Conn) []Frame {
	var fs []Frame
	c.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		f, err := ReadFrame(c)
		if err != nil {
			return fs
		}
		fs = append(fs, f)
	}
}

// A holder's HEARTBEAT has been read; before the reply is written, an
// administrator force-releases it and the next waiter is granted. The old
// holder is then told ACQUIRED (its old token) although it is out of the
// table and another session holds the lock.
func TestInterleavingHeartbeatReplyAfterForceRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var evMu sync.Mutex
		var events []Event
		srv := &Server{IOTimeout: 2 * time.Second, OnEvent: func(ev Event) {
			evMu.Lock()
			events = append(events, ev)
			evMu.Unlock()
		}}
		l := newStepListener()
		go srv.Serve(l)
		defer srv.Close()

		a, as := l.dial("a")
		sendAcquire(t, a, "x", 10*time.Second)
		tA := mustRead(t, a, TypeAcquired).Token
		b, _ := l.dial("b")
		sendAcquire(t, b, "x", 10*time.Second)
		mustRead(t, b, TypeWaiting)

		var forcedAt int
		var once sync.Once
		as.onRead = func(p []byte) {
			if p[0] == TypeHeartbeat {
				once.Do(func() {
					if _, err := srv.ForceRelease("x", 0); err != nil {
						panic(err)
					}
					forcedAt = len(l.log.snapshot())
				})
			}
		}
		if _, err := a.Write([]byte{TypeHeartbeat}); err != nil {
			t.Fatal(err)
		}
		tB := mustRead(t, b, TypeAcquired).Token
		rest := readRest(a)
		t.Logf("b was granted token %d; a held %d", tB, tA)
		noAcquiredAfterForce(t, rest, l.log.snapshot()[forcedAt:], tB)
	})
}

// noAcquiredAfterForce checks what a received after ForceRelease ended its
// session (rest): never ACQUIRED, which would now belong to b's token tB.
// It logs the server's writes after ForceRelease returned, for the reader.
func noAcquiredAfterForce(t *testing.T, rest []Frame, writes []string, tB uint64) {
	t.Helper()
	t.Logf("a received: %+v", rest)
	for i, line := range writes {
		t.Logf("server write after ForceRelease returned #%d: %s", i, line)
	}
	for _, f := range rest {
		if f.Type == TypeAcquired {
			t.Errorf("a was told ACQUIRED (token %d) after ForceRelease ended its session and granted b token %d", f.Token, tB)
		}
	}
}

// A waiter is promoted by its holder's end; before the push takes the
// waiter's wmu (held by its own goroutine, writing WAITING to a slow
// reader), an administrator force-releases it and the next waiter is
// granted and pushed. The first waiter's push is then written anyway:
// rule 5 says "a push decided before the session left stays unsent".
func TestInterleavingPushAfterForceRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &Server{IOTimeout: 5 * time.Second}
		l := newStepListener()
		go srv.Serve(l)
		defer srv.Close()

		h, _ := l.dial("h")
		sendAcquire(t, h, "x", 10*time.Second)
		mustRead(t, h, TypeAcquired)

		a, as := l.dial("a")
		sendAcquire(t, a, "x", 10*time.Second) // a does not read: join blocks writing WAITING, holding a.wmu
		synctest.Wait()

		b, _ := l.dial("b")
		sendAcquire(t, b, "x", 10*time.Second)
		mustRead(t, b, TypeWaiting)

		h.Close() // h's end grants a and waits for a.wmu to push
		// No synctest.Wait: a goroutine waiting on a mutex is not durably
		// blocked. Spin (no fake time passes) until a is promoted.
		for i := 0; ; i++ {
			if li, _ := srv.Lock("x"); li.Holder != nil && li.Holder.RemoteAddr == "a" {
				break
			}
			if i > 1e6 {
				t.Fatal("a was not promoted")
			}
			runtime.Gosched()
		}
		type result struct {
			info SessionInfo
			err  error
			mark int
		}
		forced := make(chan result, 1)
		go func() { // it pushes to b, which the test reads meanwhile
			info, err := srv.ForceRelease("x", 0)
			forced <- result{info, err, len(l.log.snapshot())}
		}()
		tB := mustRead(t, b, TypeAcquired).Token
		var r result
		select {
		case r = <-forced:
		case <-time.After(time.Minute):
			t.Fatal("ForceRelease did not return")
		}
		if r.err != nil || r.info.RemoteAddr != "a" {
			t.Fatalf("ForceRelease: %+v %v", r.info, r.err)
		}
		mark := r.mark
		// a's goroutine is paused once on its way from join to end (as
		// preemption may pause it), so the waiting push gets a.wmu first.
		var once sync.Once
		as.onSetRD = func() { once.Do(func() { time.Sleep(time.Millisecond) }) }

		noAcquiredAfterForce(t, readRest(a), l.log.snapshot()[mark:], tB)
	})
}

// Shutdown given a context must return when the context ends. A session
// whose final ERROR 0x01 cannot be written (a client that does not read)
// has already left srv.sessions, so Close does not close it, and Shutdown
// waits for that write's own io-timeout.
func TestInterleavingShutdownIgnoresContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &Server{IOTimeout: 5 * time.Second}
		l := newStepListener()
		go srv.Serve(l)

		a, _ := l.dial("a")
		sendAcquire(t, a, "x", time.Minute)
		mustRead(t, a, TypeAcquired)
		// a reads nothing from now on.

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := srv.Shutdown(ctx)
		took := time.Since(start)
		t.Logf("Shutdown returned %v after %v (ctx ended after 100ms, io-timeout 5s)", err, took)
		if took > time.Second {
			t.Errorf("Shutdown returned %v after its context ended", took-100*time.Millisecond)
		}
		a.Close()
	})
}

// Shutdown must finish within one io-timeout whatever the clients do. A
// client that takes its heartbeat reply just before the write's deadline,
// then stops reading, gets its ERROR 0x01 written with a fresh deadline
// after the session left srv.sessions, out of Close's reach.
func TestInterleavingShutdownExceedsIOTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const io = 2 * time.Second
		srv := &Server{IOTimeout: io}
		l := newStepListener()
		go srv.Serve(l)

		a, _ := l.dial("a")
		sendAcquire(t, a, "x", time.Minute)
		mustRead(t, a, TypeAcquired)
		a.Write([]byte{TypeHeartbeat}) // the reply blocks: a does not read
		time.Sleep(io / 2)

		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			srv.Shutdown(context.Background())
			done <- time.Since(start)
		}()
		time.Sleep(io/2 - 100*time.Millisecond)
		mustRead(t, a, TypeAcquired) // just in time; then a reads no more
		select {
		case took := <-done:
			t.Logf("Shutdown took %v, io-timeout %v", took, io)
			if took > io+100*time.Millisecond {
				t.Errorf("Shutdown took %v, more than one io-timeout (%v)", took, io)
			}
		case <-time.After(time.Minute):
			t.Fatal("Shutdown did not return within a (fake) minute")
		}
		a.Close()
	})
}

// A waiter promoted while it does not read: the push's write takes longer
// than the io-timeout, so the server drops it. Its release should say
// io_timeout ("a frame or a write took longer than the io-timeout").
func TestInterleavingPushTimeoutReleaseReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var evMu sync.Mutex
		var events []Event
		srv := &Server{IOTimeout: 2 * time.Second, OnEvent: func(ev Event) {
			evMu.Lock()
			events = append(events, ev)
			evMu.Unlock()
		}}
		l := newStepListener()
		go srv.Serve(l)

		h, _ := l.dial("h")
		sendAcquire(t, h, "x", time.Minute)
		mustRead(t, h, TypeAcquired)
		a, _ := l.dial("a")
		sendAcquire(t, a, "x", time.Minute)
		mustRead(t, a, TypeWaiting)
		// a reads no more.
		h.Close()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		st := srv.Stats()
		evMu.Lock()
		defer evMu.Unlock()
		for _, ev := range events {
			if ev.Type == EventReleased && ev.RemoteAddr == "a" {
				t.Logf("a's release: reason %q; Stats.Releases %v", ev.Reason, st.Releases)
				if ev.Reason != ReasonIOTimeout {
					t.Errorf("a's push write timed out, yet its release reason is %q", ev.Reason)
				}
				srv.Shutdown(context.Background())
				a.Close()
				io.Copy(io.Discard, a)
				return
			}
		}
		t.Errorf("a was never released: %+v", events)
		srv.Close()
	})
}

// A waiter whose WAITING could not be written (it does not read) is
// promoted before its goroutine leaves the table. The push must not be
// written: after a failed write the stream may end mid-frame, and the
// session is on its way out (rule 5).
func TestInterleavingNoPushAfterAFailedWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &Server{IOTimeout: time.Second}
		l := newStepListener()
		go srv.Serve(l)
		defer srv.Close()

		h, _ := l.dial("h")
		sendAcquire(t, h, "x", time.Minute)
		mustRead(t, h, TypeAcquired)
		a, as := l.dial("a")
		failedAt := -1
		var once sync.Once
		as.onWrite = func(b []byte, err error) {
			if err == nil {
				return
			}
			once.Do(func() { // a's WAITING timed out; a is still in the queue
				h.Close()
				for i := 0; ; i++ { // until h's goroutine has promoted a
					if li, _ := srv.Lock("x"); li.Holder != nil && li.Holder.RemoteAddr == "a" {
						break
					}
					if i > 1e6 {
						panic("a was not promoted")
					}
					runtime.Gosched()
				}
				for range 1000 { // and is waiting to push, for the wmu this write holds
					runtime.Gosched()
				}
				failedAt = len(l.log.snapshot())
			})
		}
		sendAcquire(t, a, "x", time.Minute) // a reads nothing until its WAITING has timed out
		time.Sleep(2 * time.Second)
		go io.Copy(io.Discard, a)
		synctest.Wait()
		if failedAt < 0 {
			t.Fatal("a's WAITING never failed")
		}
		for _, line := range l.log.snapshot()[failedAt:] {
			if strings.HasPrefix(line, "write a:") {
				t.Errorf("written to a after its write failed: %s", line)
			}
		}
		a.Close()
	})
}
