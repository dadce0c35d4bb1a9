package monolock

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// wait is how long a test waits for something that should happen at once.
// It is generous because this machine is noisy; it only bounds a failure.
const wait = 10 * time.Second

// startServer serves srv on an ephemeral loopback port until the test ends.
func startServer(t testing.TB, srv *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, srv, l)
}

// startServerWatched is startServer on a watchedListener.
func startServerWatched(t testing.TB, srv *Server) *watchedListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &watchedListener{Listener: l, writing: map[string]time.Time{}}
	serveOn(t, srv, w)
	return w
}

func serveOn(t testing.TB, srv *Server, l net.Listener) string {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		select {
		case err := <-served:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(wait):
			t.Errorf("Serve did not return within %v of Shutdown", wait)
		}
	})
	return l.Addr().String()
}

// await returns what ch delivers, failing the test if nothing comes within
// wait: what says what did not happen.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("%s did not happen within %v", what, wait)
		panic("unreachable")
	}
}

// awaitFunc runs f on a goroutine of its own and waits for it as await does.
func awaitFunc(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	await(t, done, what)
}

// bounded is a context that ends after wait, for calls that take one.
func bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// raw is a protocol client that sends and checks bytes one by one.
type raw struct {
	t testing.TB
	net.Conn
	patience time.Duration // how long it waits for a frame; 0 means wait
}

func dialRaw(t testing.TB, addr string) *raw {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &raw{t: t, Conn: c}
}

func (c *raw) send(frames ...Frame) {
	c.t.Helper()
	var b []byte
	for _, f := range frames {
		var err error
		if b, err = f.AppendBinary(b); err != nil {
			c.t.Fatal(err)
		}
	}
	c.sendBytes(b)
}

func (c *raw) sendBytes(b []byte) {
	c.t.Helper()
	c.SetWriteDeadline(time.Now().Add(wait))
	if _, err := c.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func acquire(name string, lease time.Duration) Frame {
	return Frame{Type: TypeAcquire, Name: name, LeaseMS: uint32(lease / time.Millisecond)}
}

var heartbeat = Frame{Type: TypeHeartbeat}

// read reads one frame within d.
func (c *raw) read(d time.Duration) (Frame, error) {
	c.SetReadDeadline(time.Now().Add(d))
	return ReadFrame(c)
}

func (c *raw) expect(want Frame) Frame {
	c.t.Helper()
	got, err := c.read(cmp.Or(c.patience, wait))
	if err != nil {
		c.t.Fatalf("reading %v: %v", want, err)
	}
	if got.Type != want.Type || (want.Type == TypeAcquired && want.Token != 0 && got.Token != want.Token) ||
		(want.Type == TypeError && got.Code != want.Code) {
		c.t.Fatalf("got %+v, want %+v", got, want)
	}
	return got
}

func (c *raw) expectWaiting() { c.t.Helper(); c.expect(Frame{Type: TypeWaiting}) }

// expectAcquired reads an ACQUIRED and returns its token.
func (c *raw) expectAcquired() uint64 {
	c.t.Helper()
	return c.expect(Frame{Type: TypeAcquired}).Token
}

// expectError reads an ERROR with code and then the end of the connection.
func (c *raw) expectError(code Code) Frame {
	c.t.Helper()
	f := c.expect(Frame{Type: TypeError, Code: code})
	if !strings.HasPrefix(f.Reason, code.String()) {
		c.t.Errorf("reason %q does not start with the canonical %q", f.Reason, code.String())
	}
	c.expectClosed(cmp.Or(c.patience, wait))
	return f
}

// expectClosed reads the end of the connection within d, with nothing before it.
func (c *raw) expectClosed(d time.Duration) {
	c.t.Helper()
	f, err := c.read(d)
	if err == nil {
		c.t.Fatalf("got %+v, want the connection closed", f)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		c.t.Fatalf("got %v, want the connection closed", err)
	}
}

// expectSilence checks that nothing arrives for d.
func (c *raw) expectSilence(d time.Duration) {
	c.t.Helper()
	f, err := c.read(d)
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("got %+v, %v; want nothing for %v", f, err, d)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// holderAndWaiter returns a holder of name and a waiter queued behind it.
func holderAndWaiter(t *testing.T, addr, name string) (holder, waiter *raw, token uint64) {
	holder, waiters, token := queue(t, addr, name, 1)
	return holder, waiters[0], token
}

// queue returns a holder of name and n waiters queued behind it, in order.
func queue(t *testing.T, addr, name string, n int) (holder *raw, waiters []*raw, token uint64) {
	holder = dialRaw(t, addr)
	holder.send(acquire(name, time.Minute))
	token = holder.expectAcquired()
	for range n {
		w := dialRaw(t, addr)
		w.send(acquire(name, time.Minute))
		w.expectWaiting()
		waiters = append(waiters, w)
	}
	return holder, waiters, token
}

// watchedListener gives the connections it accepts small send buffers, so
// that a client that does not read soon blocks the server's writes to it,
// and it keeps the start of every write under way, so that a test can
// see that one is blocked rather than guess it from the client's side.
type watchedListener struct {
	net.Listener
	mu      sync.Mutex
	writing map[string]time.Time // by the client's address
}

func (l *watchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	c.(*net.TCPConn).SetWriteBuffer(4096)
	return watchedConn{c, l}, nil
}

// blockedFor says how long the server's write to client has been under way.
func (l *watchedListener) blockedFor(client string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if began, ok := l.writing[client]; ok {
		return time.Since(began)
	}
	return 0
}

type watchedConn struct {
	net.Conn
	l *watchedListener
}

func (c watchedConn) Write(b []byte) (int, error) {
	client := c.RemoteAddr().String()
	c.l.mu.Lock()
	c.l.writing[client] = time.Now()
	c.l.mu.Unlock()
	defer func() {
		c.l.mu.Lock()
		delete(c.l.writing, client)
		c.l.mu.Unlock()
	}()
	return c.Conn.Write(b)
}

// waitFor polls cond until it holds, failing the test after wait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(wait); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}
