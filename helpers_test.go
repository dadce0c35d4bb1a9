package monolock

import (
	"bytes"
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"math/big"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// wait is how long a test waits for something that should happen at once.
// It is generous because this machine is noisy; it only bounds a failure.
const wait = 10 * time.Second

// soon bounds, in real time, a wait for something that should happen at
// once; it only bounds a failure.
const soon = 5 * time.Second

// overrun is how long after its bound a test lets the server act, in real
// time, on this noisy machine. Every bound checked with it is short enough
// that bound+overrun is below DefaultIOTimeout: a server that used the
// default instead of the configured value fails.
const overrun = 2 * time.Second

// inBound checks that something the server does at a bound happened d
// after a clock that the test started no later than the server's own (for
// an accept, before the dial; for a read, before the send): not before the
// bound, and not more than overrun after it.
func inBound(t testing.TB, what string, d, bound time.Duration) {
	t.Helper()
	switch {
	case d < bound:
		t.Errorf("%s after %v, before the bound of %v", what, d, bound)
	case d > bound+overrun:
		t.Errorf("%s after %v, more than %v after the bound of %v", what, d, overrun, bound)
	}
}

// atInstant checks, in fake time (testing/synctest), that something the
// server does at a deadline happened d after the clock's start: at want,
// as the bubble's clock moves only when every goroutine waits, or within
// 10ms of it for a pause of the server's own, never before.
func atInstant(t testing.TB, what string, d, want time.Duration) {
	t.Helper()
	if d < want || d > want+10*time.Millisecond {
		t.Errorf("%s at %v, want %v (fake time)", what, d, want)
	}
}

// raceEnabled: the race detector is on, and stacks are larger under it.
// The test binary's build settings say so ("-race" is "true").
var raceEnabled = func() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}()

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

// serveOn serves srv on l until the test ends, then shuts it down; but
// for a benchmark, it checks the server's invariants every millisecond
// meanwhile, and that Shutdown left no connection open.
func serveOn(t testing.TB, srv *Server, l net.Listener) string {
	if _, bench := t.(*testing.B); !bench {
		watchServer(t, srv) // its cleanup after Shutdown's
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		} else if st := srv.Stats(); st.Connections != 0 {
			t.Errorf("Shutdown returned with %d connections open", st.Connections)
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

// dialRawNarrow is dialRaw with a receive buffer of n bytes set before
// the connect, where the platform allows it (setReceiveBuffer), else
// after. Set after the connect (SetReadBuffer), the window the handshake
// advertised, 64 KiB, stays, and the server's kernel queues up to some
// 34 KB for a client that never reads, past a send buffer of 8 KiB (seen
// on Linux): at the flood rate's thousand answers a second, the server's
// write to it blocks only after 35 s, not after a few.
func dialRawNarrow(t testing.TB, addr string, n int) *raw {
	t.Helper()
	d := net.Dialer{Timeout: wait, Control: func(_, _ string, rc syscall.RawConn) error {
		if setReceiveBuffer == nil {
			return nil
		}
		var err error
		if cerr := rc.Control(func(fd uintptr) { err = setReceiveBuffer(fd, n) }); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if setReceiveBuffer == nil {
		c.(*net.TCPConn).SetReadBuffer(n)
	}
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

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
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
	failed  map[string]time.Time // by the client's address: the start of its first failed write
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

// failedWrite says when the first write to client that failed began.
func (l *watchedListener) failedWrite(client string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	began, ok := l.failed[client]
	return began, ok
}

func (c watchedConn) Write(b []byte) (int, error) {
	client := c.RemoteAddr().String()
	began := time.Now()
	c.l.mu.Lock()
	c.l.writing[client] = began
	c.l.mu.Unlock()
	n, err := c.Conn.Write(b)
	c.l.mu.Lock()
	delete(c.l.writing, client)
	if _, seen := c.l.failed[client]; err != nil && !seen {
		if c.l.failed == nil {
			c.l.failed = map[string]time.Time{}
		}
		c.l.failed[client] = began
	}
	c.l.mu.Unlock()
	return n, err
}

// stuckHolder makes a holder of name that floods heartbeats and never
// reads, and returns once the server's write to it has been under way for
// half a second: blocked, as it stays until the io-timeout, since the
// client never reads.
func stuckHolder(t *testing.T, l *watchedListener, name string) *raw {
	t.Helper()
	c := dialRaw(t, l.Addr().String())
	c.Conn.(*net.TCPConn).SetReadBuffer(1024)
	c.send(acquire(name, time.Minute))
	go func() {
		flood := bytes.Repeat([]byte{TypeHeartbeat}, 1<<16)
		for {
			if _, err := c.Conn.Write(flood); err != nil {
				return // closed by dialRaw's cleanup
			}
		}
	}()
	client := c.LocalAddr().String()
	waitFor(t, "a blocked write to a client that never reads", func() bool {
		return l.blockedFor(client) > 500*time.Millisecond
	})
	return c
}

// shutdownAsync starts srv.Shutdown without a deadline; awaitShutdown
// takes its result.
func shutdownAsync(srv *Server) <-chan error {
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	return shut
}

// awaitShutdown fails the test if Shutdown returned an error, or had not
// returned within a minute (of fake time, in a bubble).
func awaitShutdown(t testing.TB, shut <-chan error) {
	t.Helper()
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Shutdown did not return within a minute")
	}
}

// waitFor polls cond until it holds, failing the test after wait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, wait, what, cond)
}

// waitForWithin is waitFor for something that takes time, bounded by d.
func waitForWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// selfSigned returns a certificate for 127.0.0.1, made for the test.
func selfSigned(t *testing.T) tls.Certificate {
	return selfSignedFrom(t, &x509.Certificate{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
}

// selfSignedFrom signs tmpl with a new key, valid for an hour either side
// of now; its Leaf is set.
func selfSignedFrom(t *testing.T, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(1)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// eventLog collects what OnEvent is told.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

// types returns the event types so far, each as "type lock".
func (l *eventLog) types() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.events {
		out = append(out, ev.Type+" "+ev.Lock)
	}
	return out
}

// snapshot returns what OnEvent has been told so far.
func (l *eventLog) snapshot() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

type dialerFunc func(ctx context.Context, network, address string) (net.Conn, error)

func (f dialerFunc) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return f(ctx, network, address)
}

// faultProxy forwards TCP connections to a target and injects faults into
// either direction of all of them: pass, delay, or blackhole (bytes and the
// end of the stream are dropped, as in a partition); cut closes them all.
type faultProxy struct {
	addr   string
	target string

	mu    sync.Mutex
	modes [2]fault // up (client to server), down (server to client)
	conns []net.Conn
}

type fault struct {
	drop  bool
	delay time.Duration
}

const (
	up   = 0
	down = 1
)

func startProxy(t testing.TB, target string) *faultProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{addr: l.Addr().String(), target: target}
	t.Cleanup(func() {
		l.Close()
		p.cut()
	})
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go p.pump(client, server, up)
			go p.pump(server, client, down)
		}
	}()
	return p
}

func (p *faultProxy) set(dir int, f fault) {
	p.mu.Lock()
	p.modes[dir] = f
	p.mu.Unlock()
}

func (p *faultProxy) mode(dir int) fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modes[dir]
}

// cut closes every connection through the proxy.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst under the direction's fault at the moment each
// chunk is read. Delayed chunks keep their order.
func (p *faultProxy) pump(src, dst net.Conn, dir int) {
	chunks := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range chunks {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer close(chunks)
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f := p.mode(dir)
			if !f.drop {
				chunks <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(f.delay)}
			}
		}
		if err != nil {
			f := p.mode(dir)
			if f.drop {
				// A partition loses the FIN too: dst hears nothing, ever.
				select {}
			}
			if err != io.EOF {
				src.Close()
			}
			time.Sleep(f.delay) // the end of the stream is delayed like its bytes
			return
		}
	}
}

// pipeListener is a net.Listener of in-memory connections, which block
// durably inside a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	srv   *Server // the server on it, for the benchmarks' setups
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// servePipe serves srv on a new pipeListener, and closes srv when the test ends.
func servePipe(t *testing.T, srv *Server) *pipeListener {
	l := newPipeListener()
	watchServer(t, srv) // its cleanup after Close's
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l
}

// dial returns the client's end; the server sees remote as its address.
func (l *pipeListener) dial(remote string) net.Conn {
	client, server := net.Pipe()
	go func() {
		select {
		case l.conns <- namedConn{server, pipeAddr(remote)}:
		case <-l.done:
			server.Close()
		}
	}()
	return client
}

// holder dials as remote and returns the client's end once it holds name,
// for an hour; the test's end closes it.
func (l *pipeListener) holder(t *testing.T, remote, name string) net.Conn {
	c := l.dial(remote)
	t.Cleanup(func() { c.Close() })
	sendAcquire(t, c, name, time.Hour)
	mustRead(t, c, TypeAcquired)
	return c
}

// waiter dials as remote and returns the client's end once it waits for
// name under lease; the test's end closes it.
func (l *pipeListener) waiter(t *testing.T, remote, name string, lease time.Duration) net.Conn {
	c := l.dial(remote)
	t.Cleanup(func() { c.Close() })
	sendAcquire(t, c, name, lease)
	mustRead(t, c, TypeWaiting)
	return c
}

// tlsClient dials as remote over TLS at version (0: Go's default range),
// the server's end metered as through NewTLSListener, and returns the
// client's TLS end and the pipe under it.
func (l *pipeListener) tlsClient(t *testing.T, remote string, version uint16) (*tls.Conn, net.Conn) {
	client, server := net.Pipe()
	l.acceptTLS(t, namedConn{server, pipeAddr(remote)})
	return tls.Client(client, &tls.Config{InsecureSkipVerify: true, MinVersion: version, MaxVersion: version}), client
}

// acceptTLS has the server accept server, its end of a pipe, under TLS
// with a self-signed certificate.
func (l *pipeListener) acceptTLS(t *testing.T, server net.Conn) {
	l.acceptTLSUnmetered(t, newRecordConn(server))
}

// acceptTLSUnmetered is acceptTLS as through tls.NewListener: the server
// sees no record under the connection.
func (l *pipeListener) acceptTLSUnmetered(t *testing.T, server net.Conn) {
	cfg := &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
	go func() {
		select {
		case l.conns <- tls.Server(server, cfg):
		case <-l.done:
			server.Close()
		}
	}()
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return pipeAddr("listener") }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

// hookConn is a connection whose Read calls afterRead with
// its result before returning it, and whose Write calls beforeWrite first
// (an error from it is the Write's, with nothing written): a test holds
// the session's goroutines there, as a busy machine may.
type hookConn struct {
	net.Conn
	afterRead   func(n int, err error)
	beforeWrite func(b []byte) error
}

func (c *hookConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.afterRead != nil {
		c.afterRead(n, err)
	}
	return n, err
}

func (c *hookConn) Write(b []byte) (int, error) {
	if c.beforeWrite != nil {
		if err := c.beforeWrite(b); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

type namedConn struct {
	net.Conn
	remote pipeAddr
}

func (c namedConn) RemoteAddr() net.Addr { return c.remote }

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

// serveStep is servePipe on a stepListener.
func serveStep(t *testing.T, srv *Server) *stepListener {
	l := newStepListener()
	watchServer(t, srv) // its cleanup after Close's
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l
}

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

// probeConn is the server's end of an in-memory connection. It logs every
// read and the start of every write in one log shared by the test's
// connections, and calls its hooks (set before the server gets the
// connection) on the server's goroutines.
type probeConn struct {
	net.Conn
	name   string
	log    *probeLog
	writes atomic.Int64 // Write calls begun
	failed atomic.Int64 // the number of the first Write that failed; 0: none
	cuts   atomic.Int64 // past write deadlines set
	busy   atomic.Int32 // Write calls under way: more than one breaks rule 3

	afterRead   func(b []byte, err error) // after every Read, with what it returned
	beforeSetRD func()                    // SetReadDeadline and SetDeadline
	beforeSetWD func()                    // SetWriteDeadline and SetDeadline
	beforeWrite func(b []byte)            // after the write's start is counted and logged
}

// beneath is the connection beneath, which the server's linger after a
// final ERROR reads unlogged (it decides nothing).
func (c *probeConn) beneath() net.Conn { return c.Conn }

func (c *probeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.log.add(c.name, "read", b[:n])
	}
	if c.afterRead != nil {
		c.afterRead(b[:n], err)
	}
	return n, err
}

func (c *probeConn) Write(b []byte) (int, error) {
	i := c.writes.Add(1)
	if c.busy.Add(1) > 1 {
		c.log.add(c.name, overlappingWrite, b)
	}
	defer c.busy.Add(-1)
	entry := c.log.add(c.name, "write", b)
	if c.beforeWrite != nil {
		c.beforeWrite(b)
	}
	n, err := c.Conn.Write(b)
	if n == 0 {
		c.log.retitle(entry, "write, nothing sent") // no frame began: not a write to check
	}
	if err != nil {
		c.failed.CompareAndSwap(0, i)
		c.log.failed(c.name, err, b, n)
	}
	return n, err
}

func (c *probeConn) SetReadDeadline(t time.Time) error {
	if c.beforeSetRD != nil {
		c.beforeSetRD()
	}
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline calls beforeSetWD for a writer's deadline; a past one is
// a stopper's cut, set under the server's lock, where a hook could not
// look at the server: it is only counted.
func (c *probeConn) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now()) {
		c.cuts.Add(1)
	} else if c.beforeSetWD != nil {
		c.beforeSetWD()
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *probeConn) SetDeadline(t time.Time) error {
	if c.beforeSetRD != nil {
		c.beforeSetRD()
	}
	if c.beforeSetWD != nil {
		c.beforeSetWD()
	}
	return c.Conn.SetDeadline(t)
}

// overlappingWrite is the log entry of a write begun while another was
// under way on the same connection: two writers (rule 3).
const overlappingWrite = "write begun while another was under way"

type probeEntry struct {
	conn, what string
	b          []byte
	sent       int // of a failed write's b, the bytes it wrote
}

func (e probeEntry) String() string { return fmt.Sprintf("%s %s % x", e.conn, e.what, e.b) }

// probeLog is the order in which things happened on the server's
// connections, with the test's own marks in between.
type probeLog struct {
	mu      sync.Mutex
	entries []probeEntry
}

func (l *probeLog) add(conn, what string, b []byte) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, probeEntry{conn: conn, what: what, b: bytes.Clone(b)})
	return len(l.entries) - 1
}

func (l *probeLog) mark(what string) int { return l.add("test", what, nil) }

// failed logs a write of b that failed after sent bytes.
func (l *probeLog) failed(conn string, err error, b []byte, sent int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, probeEntry{conn, "write failed: " + err.Error(), bytes.Clone(b), sent})
}

func (l *probeLog) retitle(i int, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries[i].what = what
}

// writesSince returns the writes to conn that began after entry i.
func (l *probeLog) writesSince(i int, conn string) []probeEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []probeEntry
	for _, e := range l.entries[i+1:] {
		if e.conn == conn && e.what == "write" {
			out = append(out, e)
		}
	}
	return out
}

func (l *probeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sb strings.Builder
	for i, e := range l.entries {
		fmt.Fprintf(&sb, "\n  #%d %v", i, e)
	}
	return sb.String()
}

// probeNet is a pipeListener whose connections are probeConns. It also
// keeps the hooks of a test from reporting after the test has ended.
type probeNet struct {
	*pipeListener
	log    probeLog
	t      *testing.T
	over   atomic.Bool  // the test is ending: hooks stop waiting
	active atomic.Int32 // hooks under way
}

// newProbeNet's t reports what hooks' must gives up on; nil if none calls it.
func newProbeNet(t *testing.T) *probeNet { return &probeNet{pipeListener: newPipeListener(), t: t} }

// enter marks a hook under way until the function it returns is called; the
// test's cleanup waits for it, so that the hook may still report.
func (n *probeNet) enter() func() {
	n.active.Add(1)
	return func() { n.active.Add(-1) }
}

// wait polls cond for up to d, from a hook, which runs on one of the
// server's goroutines. It returns whether cond held.
func (n *probeNet) wait(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Microsecond) {
		if n.over.Load() || time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// must is wait for up to soon that reports a failure.
func (n *probeNet) must(what string, cond func() bool) bool {
	if n.wait(soon, cond) {
		return true
	}
	if !n.over.Load() {
		n.t.Errorf("gave up waiting %v for %s", soon, what)
	}
	return false
}

// end stops the hooks' waits and waits for them to return.
func (n *probeNet) end() {
	n.over.Store(true)
	for deadline := time.Now().Add(soon); n.active.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// pair returns the client's end and the server's, which the server gets
// from accept once the test has set its hooks.
func (n *probeNet) pair(name string) (net.Conn, *probeConn) {
	c, s := net.Pipe()
	return c, &probeConn{Conn: namedConn{s, pipeAddr(name)}, name: name, log: &n.log}
}

func (n *probeNet) accept(pc *probeConn) {
	go func() {
		select {
		case n.conns <- pc:
		case <-n.done:
			pc.Close()
		}
	}()
}

func showFrames(fs []Frame) string {
	parts := []string{}
	for _, f := range fs {
		switch f.Type {
		case TypeWaiting:
			parts = append(parts, "WAITING")
		case TypeAcquired:
			parts = append(parts, fmt.Sprintf("ACQUIRED(%d)", f.Token))
		case TypeError:
			parts = append(parts, fmt.Sprintf("ERROR(0x%02x)", uint8(f.Code)))
		default:
			parts = append(parts, fmt.Sprintf("type 0x%02x", f.Type))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// writesAfterStop returns the writes to conn that began after log entry
// mark, when an administrator's call that ended its session returned,
// other than its final ERROR (with code, unless code is 0) and the rest of
// a frame that a write the call cut had begun (the server finishes it
// alone): no frame but the ERROR begins after the call.
func writesAfterStop(log *probeLog, mark int, conn string, code Code) []probeEntry {
	var writes []probeEntry
	var rest []byte // of the frame the last failed write stopped inside
	log.mu.Lock()
	for i, e := range log.entries {
		switch {
		case e.conn != conn:
		case strings.HasPrefix(e.what, "write failed"):
			rest = nil
			if end := frameEnd(e.b, e.sent); end > e.sent {
				rest = e.b[e.sent:end]
			}
		case e.what == "write":
			finishing := rest != nil && bytes.Equal(e.b, rest)
			rest = nil
			if i > mark && !finishing {
				writes = append(writes, e)
			}
		}
	}
	log.mu.Unlock()
	if n := len(writes); n > 0 {
		w := writes[n-1].b
		if f, err := ReadFrame(bytes.NewReader(w)); err == nil && f.Type == TypeError && (code == 0 || f.Code == code) && len(w) == 3+len(f.Reason) {
			writes = writes[:n-1] // the final ERROR
		}
	}
	return writes
}

// blockingHandler is a slog.Handler whose Handle blocks on messages equal
// to msg until release is closed, after closing entered.
type blockingHandler struct {
	msg     string
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler            { return h }
func (h *blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg && h.once.CompareAndSwap(false, true) {
		close(h.entered)
		<-h.release
	}
	return nil
}

// invariantsLocked checks, with srv.mu held, what must hold between any
// two of the server's critical sections (server.go's rules and the
// comments of its types): every lock has a holder (endLocked hands it on
// in the critical section that ends the last, and after Shutdown or Close
// began the table is empty); a holder holds under a token given; waiters
// wait, unpromoted, in the order they joined; a session is in the table
// exactly while it waits or holds, and is counted until its connection is
// closed; a session not ending has nothing dropped and nothing final, and
// whatever was decided for it has a writer; nothing is owed after a drop,
// nor after an end but what precedes its final ERROR (rules 2 and 4); each
// grant is released once. With quiet, when every goroutine
// of the server waits (in a synctest bubble, after synctest.Wait), also:
// an ending session has a writer at work (else nobody would close it), no
// live session is past its lease, and OnEvent has been told everything.
func (srv *Server) invariantsLocked(quiet bool) error {
	if srv.locks == nil {
		return nil // not yet serving
	}
	holders, waiters, tokens := 0, 0, map[uint64]bool{}
	for name, l := range srv.locks {
		if l.holder == nil { // endLocked hands it on in its critical section
			return fmt.Errorf("lock %q has no holder and %d waiters", name, l.waiters.Len())
		}
		if h := l.holder; h != nil {
			holders++
			switch _, counted := srv.sessions[h]; {
			case h.phase != phaseHolding || h.lock != l || h.elem != nil || h.name != name || !counted:
				return fmt.Errorf("holder of %q: %s", name, h.dump(counted))
			case h.token == 0 || h.token > srv.lastToken || tokens[h.token]:
				return fmt.Errorf("holder of %q: token %d, last given %d, or another holder's", name, h.token, srv.lastToken)
			}
			tokens[h.token] = true
		}
		var joined time.Time
		for e := l.waiters.Front(); e != nil; e = e.Next() {
			waiters++
			s := e.Value.(*session)
			switch _, counted := srv.sessions[s]; {
			case s.phase != phaseWaiting || s.lock != l || s.elem != e || s.name != name || s.token != 0 || s.owedAcquired != 0 || !counted:
				return fmt.Errorf("waiter of %q: %s", name, s.dump(counted))
			case s.since.Before(joined):
				return fmt.Errorf("waiter of %q queued at %v behind one queued at %v", name, s.since, joined)
			}
			joined = s.since
		}
	}
	for s := range srv.sessions {
		live := s.phase == phaseWaiting || s.phase == phaseHolding
		owed := s.owedWaiting+s.owedAcquired > 0
		var bad string
		switch {
		case s.phase == phaseClosed:
			bad = "closed but still counted"
		case live && (s.lock == nil || srv.locks[s.name] != s.lock || (s.lock.holder == s) != (s.phase == phaseHolding)):
			bad = "waiting or holding but not in the table as such"
		case !live && (s.lock != nil || s.elem != nil):
			bad = "neither waiting nor holding but in the table"
		case s.phase < phaseEnding && (s.stopped.Load() || s.final != nil):
			bad = "not ending but dropped or given a final ERROR"
		case s.phase < phaseWaiting && owed:
			bad = "owed answers before it joined"
		case s.phase < phaseEnding && owed && !s.writing:
			bad = "owed answers that no writer will write"
		case owed && (s.stopped.Load() || s.phase >= phaseEnding && s.final == nil):
			bad = "owed answers after a drop, or after its end but for those before its final ERROR"
		case srv.closing.Load() && s.phase < phaseEnding:
			bad = "not ending after Shutdown or Close began"
		case quiet && s.phase == phaseEnding && !s.writing:
			bad = "ending with nobody at work to close it"
		case quiet && live && time.Since(s.seen) >= s.lease:
			bad = fmt.Sprintf("silent for %v, past its lease", time.Since(s.seen))
		}
		if bad != "" {
			return fmt.Errorf("session %s: %s: %s", s.remote, bad, s.dump(true))
		}
	}
	var released uint64
	for _, n := range srv.counts.Releases {
		released += n
	}
	switch c := srv.counts; {
	case c.Grants != released+uint64(holders):
		return fmt.Errorf("%d grants, %d releases and %d holders", c.Grants, released, holders)
	case c.Acquires < c.Grants+uint64(waiters):
		return fmt.Errorf("%d acquires, fewer than %d grants and %d waiters", c.Acquires, c.Grants, waiters)
	case srv.closing.Load() && len(srv.locks) > 0:
		return fmt.Errorf("%d locks in the table after Shutdown or Close began", len(srv.locks))
	case len(srv.events) > 0 && !srv.delivering, quiet && (srv.delivering || len(srv.events) > 0):
		return fmt.Errorf("%d events undelivered, delivering %v", len(srv.events), srv.delivering)
	}
	return nil
}

func (s *session) dump(counted bool) string {
	return fmt.Sprintf("phase %d, lock %p, elem %p, name %q, token %d, owed %d+%d, final %v, writing %v, stopped %v, counted %v",
		s.phase, s.lock, s.elem, s.name, s.token, s.owedWaiting, s.owedAcquired, s.final, s.writing, s.stopped.Load(), counted)
}

// watchServer checks srv's invariants every millisecond until the test
// ends, for a test that serves it: its cleanup, which reports what it saw,
// runs after those registered later.
func watchServer(t testing.TB, srv *Server) {
	stop := watchInvariants(srv, time.Millisecond, false)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("the server's invariants: %v", err)
		}
	})
}

// watchInvariants checks srv.invariantsLocked, and the queues' order from
// one check to the next (queueOrder), at intervals of every (or of ten
// times what the last check took, if longer) until the returned stop is
// called, and once more then; stop returns the first violation seen, or
// nil. With quiet, it runs in a synctest bubble and at each interval's end
// checks again, with quiet, once every other goroutine waits: it must be
// the bubble's only caller of synctest.Wait.
func watchInvariants(srv *Server, every time.Duration, quiet bool) (stop func() error) {
	done, result := make(chan struct{}), make(chan error, 1)
	go func() {
		var first error
		var order queueOrder
		var took time.Duration // by the last check, holding srv.mu
		check := func(quiet bool) {
			srv.mu.Lock()
			start := time.Now()
			err := cmp.Or(srv.invariantsLocked(quiet), order.checkLocked(srv))
			took = time.Since(start)
			srv.mu.Unlock()
			if first == nil && err != nil {
				first = fmt.Errorf("at %v: %w", time.Now().Format("15:04:05.000000"), err)
			}
		}
		for {
			// A tenth of the time at most under srv.mu: a table of thousands
			// of sessions (under the race detector, some ms a check) must not
			// slow the server that a test times.
			next := time.NewTimer(max(every, 10*took))
			select {
			case <-done:
				next.Stop()
				check(false)
				result <- first
				return
			case <-next.C:
			}
			check(false) // between whatever else runs at this instant
			if quiet {
				synctest.Wait()
				check(true)
			}
		}
	}()
	return func() error {
		close(done)
		select {
		case err := <-result:
			return err
		case <-time.After(wait):
			return fmt.Errorf("the watcher did not stop within %v: srv.mu held?", wait)
		}
	}
}

// tls13Sender encrypts records of a TLS 1.3 client by hand (AES-GCM
// suites), from its traffic secret, so that a test can send what
// crypto/tls's client never sends on its own: a KeyUpdate (RFC 8446
// §4.6.3), which either side may send at any time.
type tls13Sender struct {
	newHash func() hash.Hash
	keyLen  int
	secret  []byte
	aead    cipher.AEAD
	iv      []byte
	seq     uint64
}

// dialServedTLS serves srv over TLS on an ephemeral loopback port until the
// test ends, and returns a raw TCP connection to it, for a TLS client the
// test drives itself.
func dialServedTLS(t *testing.T, srv *Server) net.Conn {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv, NewTLSListener(l, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}))
	raw, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// handshakeTLS13 completes a TLS 1.3 client handshake over conn and
// returns the client with a sender of its records, which takes the traffic
// secret from the handshake's key log. It skips the test unless the suite
// is AES-GCM, the one the sender speaks.
func handshakeTLS13(t *testing.T, conn net.Conn) (*tls.Conn, *tls13Sender) {
	return handshakeTLS13With(t, conn, &tls.Config{})
}

// handshakeTLS13With is handshakeTLS13 with cfg's other settings.
func handshakeTLS13With(t *testing.T, conn net.Conn, cfg *tls.Config) (*tls.Conn, *tls13Sender) {
	var keylog bytes.Buffer
	cfg.InsecureSkipVerify, cfg.MinVersion, cfg.KeyLogWriter = true, tls.VersionTLS13, &keylog
	c := tls.Client(conn, cfg)
	c.SetDeadline(time.Now().Add(wait))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	s, err := newTLS13Sender(c.ConnectionState().CipherSuite)
	if err != nil {
		t.Skip(err)
	}
	secret, err := keyLogSecret(keylog.String(), "CLIENT_TRAFFIC_SECRET_0")
	if err != nil {
		t.Fatal(err)
	}
	s.setSecret(secret)
	return c, s
}

// newTLS13Sender returns a sender for a TLS 1.3 cipher suite, without its
// secret (setSecret), or an error unless the suite is AES-GCM, the one
// the sender speaks.
func newTLS13Sender(suite uint16) (*tls13Sender, error) {
	switch suite {
	case tls.TLS_AES_128_GCM_SHA256:
		return &tls13Sender{newHash: sha256.New, keyLen: 16}, nil
	case tls.TLS_AES_256_GCM_SHA384:
		return &tls13Sender{newHash: sha512.New384, keyLen: 32}, nil
	}
	return nil, fmt.Errorf("cipher suite %s: the test encrypts with AES-GCM only", tls.CipherSuiteName(suite))
}

// keyLogSecret returns the secret of a key log's line with the label
// (NSS's format: label, client random, secret).
func keyLogSecret(keylog, label string) ([]byte, error) {
	for line := range strings.Lines(keylog) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == label {
			return hex.DecodeString(f[2])
		}
	}
	return nil, fmt.Errorf("no %s in the key log", label)
}

func (s *tls13Sender) expand(secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := append([]byte{byte(n >> 8), byte(n), byte(len(full))}, full...)
	out, err := hkdf.Expand(s.newHash, secret, string(append(info, 0)), n)
	if err != nil {
		panic(err)
	}
	return out
}

func (s *tls13Sender) setSecret(secret []byte) {
	block, err := aes.NewCipher(s.expand(secret, "key", s.keyLen))
	if err != nil {
		panic(err)
	}
	s.secret, s.iv, s.seq = secret, s.expand(secret, "iv", 12), 0
	s.aead, _ = cipher.NewGCM(block)
}

// updateKeys moves to the next traffic secret, as after sending a KeyUpdate.
func (s *tls13Sender) updateKeys() {
	s.setSecret(s.expand(s.secret, "traffic upd", s.newHash().Size()))
}

// open decrypts rec, a whole record sealed with the secret, as the next
// record of the other side (a test that reads what the server wrote):
// it returns the inner content type and the plaintext, or an error if
// the record does not open with this secret.
func (s *tls13Sender) open(rec []byte) (contentType byte, plain []byte, err error) {
	nonce := bytes.Clone(s.iv)
	for i := range 8 {
		nonce[4+i] ^= byte(s.seq >> (56 - 8*i))
	}
	inner, err := s.aead.Open(nil, nonce, rec[5:], rec[:5])
	if err != nil {
		return 0, nil, err
	}
	s.seq++
	inner = bytes.TrimRight(inner, "\x00") // padding
	if len(inner) == 0 {
		return 0, nil, errors.New("a record of padding only")
	}
	return inner[len(inner)-1], inner[:len(inner)-1], nil
}

// record seals msg as the next record of the given content type.
func (s *tls13Sender) record(contentType byte, msg []byte) []byte {
	return s.sealPadded(contentType, msg, 0)
}

// sealPadded is record with the inner plaintext padded with zeros to pad
// bytes in all (at most 2^14+1), as TLS 1.3 allows.
func (s *tls13Sender) sealPadded(contentType byte, msg []byte, pad int) []byte {
	nonce := bytes.Clone(s.iv)
	for i := range 8 {
		nonce[4+i] ^= byte(s.seq >> (56 - 8*i))
	}
	s.seq++
	inner := append(bytes.Clone(msg), contentType)
	if len(inner) < pad {
		inner = append(inner, make([]byte, pad-len(inner))...)
	}
	hdr := []byte{0x17, 0x03, 0x03, 0, 0} // application_data, TLS 1.2 on the wire
	binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+s.aead.Overhead()))
	return s.aead.Seal(hdr, nonce, inner, hdr)
}

// keyUpdateRequested is a KeyUpdate that asks for one in return.
var keyUpdateRequested = []byte{24, 0, 0, 1, 1}

// keyUpdates returns n KeyUpdates that ask for one in return, a record
// each, and moves the sender to the keys that follow them.
func (s *tls13Sender) keyUpdates(n int) []byte {
	var b []byte
	for range n {
		b = append(b, s.record(22, keyUpdateRequested)...)
		s.updateKeys()
	}
	return b
}

// queueOrder holds each lock's queue to strict FIFO from one check to the
// next, however many sessions joined at one instant (fake time gives them
// one queued-at time): a waiter first seen is numbered after every one seen
// before, so the numbers of a queue rise from its front; and a holder seen
// waiting was granted only once none seen ahead of it still waits.
type queueOrder struct {
	seen map[*session]uint64 // waiters and former waiters, while counted
	last uint64
}

func (q *queueOrder) checkLocked(srv *Server) error {
	if q.seen == nil {
		q.seen = map[*session]uint64{}
	}
	for s := range q.seen {
		if _, counted := srv.sessions[s]; !counted {
			delete(q.seen, s)
		}
	}
	for name, l := range srv.locks {
		var ahead *session
		for e := l.waiters.Front(); e != nil; e = e.Next() {
			s := e.Value.(*session)
			if _, ok := q.seen[s]; !ok {
				q.last++
				q.seen[s] = q.last
			}
			if ahead != nil && q.seen[s] < q.seen[ahead] {
				return fmt.Errorf("waiter %s of %q is ahead of %s, which was seen waiting before it", ahead.remote, name, s.remote)
			}
			ahead = s
		}
		h, front := l.holder, l.waiters.Front()
		if n, ok := q.seen[h]; ok && front != nil && q.seen[front.Value.(*session)] < n {
			return fmt.Errorf("holder %s of %q was granted while %s, seen waiting ahead of it, still waits", h.remote, name, front.Value.(*session).remote)
		}
	}
	return nil
}

// countRecords counts the TLS records the server writes on raw.
func countRecords(raw net.Conn, records *atomic.Int64) {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(raw, hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, raw, int64(binary.BigEndian.Uint16(hdr[3:]))); err != nil {
			return
		}
		records.Add(1)
	}
}

// holdAfterHello passes the ClientHello (the writes of plaintext handshake
// records, type 22, before any other) and keeps every later write until
// flush, which writes it with extra in one Write: the client's Finished
// and what follows arrive together.
type holdAfterHello struct {
	net.Conn
	mu    sync.Mutex
	hello bool // the ClientHello is passed
	open  bool
	buf   []byte
}

func (c *holdAfterHello) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.hello = c.hello || b[0] != 22
	if !c.hello || c.open {
		c.mu.Unlock()
		return c.Conn.Write(b)
	}
	c.buf = append(c.buf, b...)
	c.mu.Unlock()
	return len(b), nil
}

func (c *holdAfterHello) flush(extra []byte) error {
	c.mu.Lock()
	b := append(c.buf, extra...)
	c.buf, c.open = nil, true
	c.mu.Unlock()
	_, err := c.Conn.Write(b)
	return err
}

// held takes the client's held last flight (its CCS and Finished) out of
// c, unsent, and lets later writes through.
func (c *holdAfterHello) held() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buf
	c.buf, c.open = nil, true
	return b
}

// fillRecords appends records made by rec to a until it is size bytes
// long; the last may be cut after its header (its units are counted with
// the header), and its rest, or all of it, is returned; n counts the
// records made.
func fillRecords(a []byte, size int, rec func() []byte) (out, rest []byte, n int) {
	for len(a) < size {
		r := rec()
		if k := size - len(a); len(r) > k {
			if k < 5 { // its header would be cut: it goes after
				return a, r, n + 1
			}
			return append(a, r[:k]...), r[k:], n + 1
		}
		a, n = append(a, r...), n+1
	}
	return a, nil, n
}

// alpnPadding is a NextProtos list of n protocols of 255 bytes: a
// ClientHello of about n/4 KiB, which crypto/tls's read buffer grows to fit.
func alpnPadding(n int) []string {
	var p []string
	for i := range n {
		p = append(p, fmt.Sprintf("%04d", i)+strings.Repeat("p", 251))
	}
	return p
}

// handshakeHeld is handshakeTLS13 with the client's last flight held.
func handshakeHeld(t *testing.T, raw net.Conn, alpn int) (*tls.Conn, *tls13Sender, *holdAfterHello) {
	hc := &holdAfterHello{Conn: raw}
	c, s := handshakeTLS13With(t, hc, &tls.Config{NextProtos: alpnPadding(alpn)})
	return c, s, hc
}

// holdOverTLS holds lock x with lease over a pipe that l serves through
// its metered TLS, by the test's own TLS 1.3 client: it returns the raw
// end, the client and its record sender, the ACQUIRE's record sent.
func holdOverTLS(t *testing.T, l *pipeListener, lease time.Duration) (net.Conn, *tls.Conn, *tls13Sender) {
	t.Helper()
	raw, server := net.Pipe()
	c, s := joinOverTLS(t, l, raw, server, lease, TypeAcquired)
	return raw, c, s
}

// joinOverTLS has l serve server, the other end of client, through its
// metered TLS, joins lock x with lease by the test's own TLS 1.3 client on
// client, and reads want: it returns the client and its record sender,
// the ACQUIRE's record sent.
func joinOverTLS(t *testing.T, l *pipeListener, client, server net.Conn, lease time.Duration, want byte) (*tls.Conn, *tls13Sender) {
	t.Helper()
	l.acceptTLS(t, server)
	c, s := handshakeTLS13(t, client)
	sendAcquire(t, c, "x", lease)
	s.seq = 1 // the ACQUIRE was the first record
	mustRead(t, c, want)
	return c, s
}

// refusing returns an address that refuses connections until its listen
// is called, which returns the listener on it. A closed listener's port
// would do on its own, but it is free for the next test's listener, which
// would then answer; on unix (helpers_unix_test.go) the port stays taken.
var refusing = func(t *testing.T) (string, func() (net.Listener, error)) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr, func() (net.Listener, error) { return net.Listen("tcp", addr) }
}

// serveFake is servePipe inside a synctest bubble: the test's end closes
// srv, then lets a minute of fake time pass, for the rate's sleeps and the
// sessions' ends to run out.
func serveFake(t *testing.T, srv *Server) *pipeListener {
	l := servePipe(t, srv)
	t.Cleanup(func() {
		srv.Close()
		time.Sleep(time.Minute)
	})
	return l
}

// dialTLS returns the client's end of a connection the server accepts
// under TLS, its records metered as through NewTLSListener.
func (l *pipeListener) dialTLS(t *testing.T) net.Conn {
	raw, server := net.Pipe()
	l.acceptTLS(t, server)
	return raw
}
