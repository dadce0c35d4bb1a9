package monolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Regression tests for the ways a session's end can cross another
// session's, an administrator's call or a shutdown. Each places the
// crossing at one exact point through hooks on the server's connections
// (every server must call Read, Write and the deadlines), and uses only the
// package's exported API, so that they hold any implementation of the
// server to the protocol: docs/protocol.md, sections 4 ("The last frame is
// the last frame") and 6.
//
// Every client's whole byte stream is read until the server closes it and
// compared with what the protocol allows.

// soon bounds, in real time, a wait for something that should happen at
// once; it only bounds a failure.
const soon = 5 * time.Second

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

	afterRead   func(b []byte, err error) // after every Read, with what it returned
	beforeSetRD func()                    // SetReadDeadline and SetDeadline
	beforeSetWD func()                    // SetWriteDeadline and SetDeadline
	beforeWrite func(b []byte)            // after the write's start is counted and logged
}

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
		c.log.add(c.name, "write failed: "+err.Error(), nil)
	}
	return n, err
}

func (c *probeConn) SetReadDeadline(t time.Time) error {
	if c.beforeSetRD != nil {
		c.beforeSetRD()
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *probeConn) SetWriteDeadline(t time.Time) error {
	if c.beforeSetWD != nil {
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

type probeEntry struct {
	conn, what string
	b          []byte
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
	l.entries = append(l.entries, probeEntry{conn, what, bytes.Clone(b)})
	return len(l.entries) - 1
}

func (l *probeLog) mark(what string) int { return l.add("test", what, nil) }

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

// clientStream reads, as a client must, every frame the server sends on
// one connection until it ends, keeping each frame's arrival time.
type clientStream struct {
	name   string
	ch     chan Frame
	done   chan struct{}
	mu     sync.Mutex
	frames []Frame
	at     []time.Time
	err    error // what ended the stream
}

func watch(name string, c net.Conn) *clientStream {
	s := &clientStream{name: name, ch: make(chan Frame, 64), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			f, err := ReadFrame(c)
			s.mu.Lock()
			if err != nil {
				s.err = err
				s.mu.Unlock()
				return
			}
			s.frames = append(s.frames, f)
			s.at = append(s.at, time.Now())
			s.mu.Unlock()
			s.ch <- f
		}
	}()
	return s
}

// next returns the stream's next frame, which must be of type typ.
func (s *clientStream) next(t *testing.T, typ byte) Frame {
	t.Helper()
	var f Frame
	select {
	case f = <-s.ch:
	case <-s.done:
		select {
		case f = <-s.ch:
		default:
			t.Fatalf("%s: the stream ended (%v) before a frame of type 0x%02x: %s", s.name, s.err, typ, s.show())
		}
	case <-time.After(soon):
		t.Fatalf("%s: no frame of type 0x%02x within %v: %s", s.name, typ, soon, s.show())
	}
	if f.Type != typ {
		t.Fatalf("%s: got %s, want a frame of type 0x%02x", s.name, showFrames([]Frame{f}), typ)
	}
	return f
}

// finish waits for the end of the stream and returns all its frames. The
// stream must end between two frames: by the server's close (EOF), or by
// the test's (closed pipe).
func (s *clientStream) finish(t *testing.T) ([]Frame, []time.Time) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(soon):
		t.Fatalf("%s: the server did not close the connection within %v: %s", s.name, soon, s.show())
	}
	if !errors.Is(s.err, io.EOF) && !errors.Is(s.err, io.ErrClosedPipe) {
		t.Errorf("%s: the stream is not a sequence of frames: %v after %s", s.name, s.err, s.show())
	}
	return s.frames, s.at
}

func (s *clientStream) show() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return showFrames(s.frames)
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

// expectStream reads s to its end and checks that it is exactly want: the
// types, the codes of ERRORs, and the tokens of ACQUIREDs where want has one.
func expectStream(t *testing.T, s *clientStream, want ...Frame) []Frame {
	t.Helper()
	got, _ := s.finish(t)
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		g, w := got[i], want[i]
		ok = g.Type == w.Type && (w.Type != TypeError || g.Code == w.Code) &&
			(w.Type != TypeAcquired || w.Token == 0 || g.Token == w.Token)
	}
	if !ok {
		t.Errorf("%s received %s, want %s", s.name, showFrames(got), showFrames(want))
	}
	return got
}

var (
	waitingFrame = Frame{Type: TypeWaiting}
	acquiredAny  = Frame{Type: TypeAcquired}
)

func acquiredFrame(token uint64) Frame { return Frame{Type: TypeAcquired, Token: token} }
func errorFrame(code Code) Frame       { return Frame{Type: TypeError, Code: code} }

func sendFrames(t *testing.T, c net.Conn, frames ...Frame) {
	t.Helper()
	var b []byte
	for _, f := range frames {
		b, _ = f.AppendBinary(b)
	}
	sendRaw(t, c, b)
}

func sendRaw(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(soon))
	if _, err := c.Write(b); err != nil {
		t.Fatalf("client write % x: %v", b, err)
	}
}

// holderOf returns the remote address of name's holder, or "".
func holderOf(srv *Server, name string) string {
	if li, ok := srv.Lock(name); ok && li.Holder != nil {
		return li.Holder.RemoteAddr
	}
	return ""
}

// snapshot returns what OnEvent has been told so far.
func (l *eventLog) snapshot() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// grantsAndReleases returns name's grants and releases, as "granted a".
func grantsAndReleases(evs []Event, name string) []string {
	var out []string
	for _, ev := range evs {
		if ev.Lock == name && (ev.Type == EventGranted || ev.Type == EventReleased) {
			out = append(out, ev.Type+" "+ev.RemoteAddr)
		}
	}
	return out
}

// shutdownNow shuts srv down, which ends every stream still open with
// ERROR 0x01, and waits for Serve and for OnEvent to be told everything.
func shutdownNow(t *testing.T, srv *Server, served <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), soon)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	select {
	case <-served:
	case <-time.After(soon):
		t.Errorf("Serve did not return within %v of Shutdown", soon)
	}
}

func serveProbes(t *testing.T, srv *Server) (*probeNet, <-chan error) {
	n := newProbeNet(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(n) }()
	t.Cleanup(func() {
		n.end()
		srv.Close()
	})
	return n, served
}

// A waiter that has sent HEARTBEAT and an unknown type byte in one write is
// ending on its own once the server has read the bad byte: the holder
// leaving then must not promote it (no token spent on it, no ACQUIRED
// before its ERROR 0x13). The holder leaves while the server's first write
// after reading the bad byte (the heartbeat's WAITING) is held.
func TestPromotionSkipsEndingWaiter(t *testing.T) {
	var ev eventLog
	srv := &Server{IOTimeout: soon, OnEvent: ev.add}
	n, served := serveProbes(t, srv)

	hc, hs := n.pair("h")
	n.accept(hs)
	h := watch("h", hc)
	sendFrames(t, hc, acquire("x", time.Minute))
	h.next(t, TypeAcquired)

	ac, as := n.pair("a")
	var badRead, held, pushWaited atomic.Bool
	var writesAtHold atomic.Int64
	as.afterRead = func(b []byte, err error) {
		if bytes.IndexByte(b, 0x7f) >= 0 {
			badRead.Store(true)
		}
	}
	as.beforeWrite = func(b []byte) {
		if !badRead.Load() || held.Swap(true) {
			return
		}
		defer n.enter()()
		// The server has read 0x7f and not yet answered it: h leaves now.
		writesAtHold.Store(as.writes.Load())
		n.log.mark("h closes")
		hc.Close()
		n.must("h to leave the table", func() bool { return holderOf(srv, "x") != "h" })
		n.log.mark("h has left the table")
	}
	as.beforeSetRD = func() {
		if !held.Load() || pushWaited.Swap(true) {
			return
		}
		defer n.enter()()
		if holderOf(srv, "x") == "a" { // promoted: a push is due; let it go first, as the scheduler may
			n.must("the push to a to begin", func() bool { return as.writes.Load() > writesAtHold.Load() })
		}
	}
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", time.Minute))
	a.next(t, TypeWaiting)

	sendRaw(t, ac, []byte{TypeHeartbeat, 0x7f})
	got, _ := a.finish(t)
	shutdownNow(t, srv, served)
	expectStream(t, h, acquiredAny)
	if !held.Load() {
		t.Fatalf("the server wrote nothing to a after reading 0x7f; log:%v", &n.log)
	}

	// WAITING answers the ACQUIRE and (if the server answers it) the
	// HEARTBEAT; ERROR 0x13 answers 0x7f; nothing else.
	ok := len(got) >= 2 && got[len(got)-1].Type == TypeError && got[len(got)-1].Code == CodeUnknownType
	for i := 0; ok && i < len(got)-1; i++ {
		ok = got[i].Type == TypeWaiting && i < 2
	}
	if !ok {
		t.Errorf("a received %s; want [WAITING WAITING ERROR(0x13)] (or [WAITING ERROR(0x13)]), never ACQUIRED", showFrames(got))
	}
	for _, e := range ev.snapshot() {
		if e.Type == EventGranted && e.RemoteAddr == "a" {
			t.Errorf("token %d was spent on a, whose 0x7f the server had read before h left", e.Token)
		}
	}
	if g := srv.Stats().Grants; g != 1 {
		t.Errorf("Stats.Grants = %d, want 1 (h only)", g)
	}
	if t.Failed() {
		t.Logf("server log:%v", &n.log)
	}
}

// A waiter whose lease has passed by the server's clock is not promoted,
// even if its goroutine has not yet acted on it: the next live waiter is.
// The read that tells the server of a's silence is held until the holder
// has left.
func TestPromotionSkipsExpiredWaiter(t *testing.T) {
	var ev eventLog
	srv := &Server{IOTimeout: soon, OnEvent: ev.add}
	n, served := serveProbes(t, srv)

	hc, hs := n.pair("h")
	n.accept(hs)
	h := watch("h", hc)
	sendFrames(t, hc, acquire("x", time.Minute))
	h.next(t, TypeAcquired)

	const lease = 50 * time.Millisecond
	ac, as := n.pair("a")
	readFailed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var heldOnce atomic.Bool
	as.afterRead = func(b []byte, err error) {
		if len(b) == 0 && err != nil && !heldOnce.Swap(true) {
			close(readFailed) // the server is about to learn that a was silent
			<-release
		}
	}
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", lease))
	a.next(t, TypeWaiting)

	bc, bs := n.pair("b")
	n.accept(bs)
	b := watch("b", bc)
	sendFrames(t, bc, acquire("x", time.Minute))
	b.next(t, TypeWaiting)

	select {
	case <-readFailed:
	case <-time.After(20 * lease):
		t.Logf("no read on a failed within %v; going on: its lease of %v has passed", 20*lease, lease)
	}
	time.Sleep(lease) // whatever the server's rounding: a's lease has passed
	n.log.mark("h closes")
	hc.Close()
	waitFor(t, "h to leave the table", func() bool { return holderOf(srv, "x") != "h" })
	n.log.mark("h has left the table")
	once.Do(func() { close(release) })

	expectStream(t, a, waitingFrame) // dropped without an ERROR, never ACQUIRED
	tB := b.next(t, TypeAcquired).Token
	shutdownNow(t, srv, served)
	expectStream(t, b, waitingFrame, acquiredFrame(tB), errorFrame(CodeShuttingDown))
	expectStream(t, h, acquiredAny)
	got := grantsAndReleases(ev.snapshot(), "x")
	want := []string{"granted h", "released h", "granted b", "released b"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("the grants and releases of x were %q, want %q: a's lease had passed when h left", got, want)
	}
	if t.Failed() {
		t.Logf("server log:%v", &n.log)
	}
}

// adminStop runs an administrator's call on a goroutine of its own, from a
// hook that holds one of the server's goroutines, and marks in the log the
// moment the call returned.
type adminStop struct {
	n      *probeNet
	call   func() (SessionInfo, error)
	fired  atomic.Bool
	where  string
	result chan adminResult
}

type adminResult struct {
	info SessionInfo
	err  error
	mark int // the log entry made when the call returned
}

func newAdminStop(n *probeNet, call func() (SessionInfo, error)) *adminStop {
	return &adminStop{n: n, call: call, result: make(chan adminResult, 1)}
}

// fire makes the call, once, and waits for it to return (bounded: the
// goroutine it holds may be one the call has to wait for).
func (s *adminStop) fire(where string) {
	if s.fired.Swap(true) {
		return
	}
	defer s.n.enter()()
	s.where = where
	var done atomic.Bool
	go func() {
		info, err := s.call()
		s.result <- adminResult{info, err, s.n.log.mark("the administrator's call returned")}
		done.Store(true)
	}()
	s.n.must("the administrator's call to return while the server's write was held "+where, done.Load)
}

// returned waits for the call's result.
func (s *adminStop) returned(t *testing.T) adminResult {
	t.Helper()
	select {
	case r := <-s.result:
		if r.err != nil {
			t.Fatalf("the administrator's call: %v", r.err)
		}
		return r
	case <-time.After(soon):
		if !s.fired.Load() {
			t.Fatalf("the server did not write to the session within %v: the administrator's call was never made; log:%v", soon, &s.n.log)
		}
		t.Fatalf("the administrator's call did not return within %v", soon)
		panic("unreachable")
	}
}

// hookBeforeWrite arms stop at the server's next write to pc once armed is
// set: at its write deadline, after the server's last check and before
// the write begins; or, for a server that sets none, at the write's start.
func hookBeforeWrite(pc *probeConn, armed *atomic.Bool, when func() bool, stop *adminStop) {
	pc.beforeSetWD = func() {
		if armed.Load() && when() {
			stop.fire("at its write deadline")
		}
	}
	pc.beforeWrite = func([]byte) {
		if armed.Load() && when() {
			stop.fire("as the write began (the server set no write deadline before it; nothing is tested)")
		}
	}
}

// noWriteAfter checks that, after the administrator's call returned, no
// write began on conn but the one final ERROR 0x02.
func noWriteAfter(t *testing.T, log *probeLog, r adminResult, conn string) {
	t.Helper()
	for _, w := range writesAfterStop(log, r.mark, conn, CodeClosedByAdmin) {
		f, _ := ReadFrame(bytes.NewReader(w.b))
		t.Errorf("a write to %s began after the administrator's call returned: % x %s", conn, w.b, showFrames([]Frame{f}))
	}
}

// writesAfterStop returns the writes to conn that began after log entry
// mark, when an administrator's call that ended its session returned,
// other than its final ERROR (with code, unless code is 0).
func writesAfterStop(log *probeLog, mark int, conn string, code Code) []probeEntry {
	writes := log.writesSince(mark, conn)
	if n := len(writes); n > 0 {
		w := writes[n-1].b
		if f, err := ReadFrame(bytes.NewReader(w)); err == nil && f.Type == TypeError && (code == 0 || f.Code == code) && len(w) == 3+len(f.Reason) {
			writes = writes[:n-1] // the final ERROR
		}
	}
	return writes
}

// A holder's HEARTBEAT has been read and checked, and its reply is about to
// be written, when an administrator force-releases the holder: once
// ForceRelease has returned (and the next waiter has the lock), no reply
// may begin on the old holder's connection, only its ERROR 0x02.
func TestNoHeartbeatReplyAfterForceRelease(t *testing.T) {
	srv := &Server{IOTimeout: soon}
	n, served := serveProbes(t, srv)

	ac, as := n.pair("a")
	var armed atomic.Bool
	stop := newAdminStop(n, func() (SessionInfo, error) { return srv.ForceRelease("x", 0) })
	hookBeforeWrite(as, &armed, func() bool { return true }, stop)
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", time.Minute))
	tA := a.next(t, TypeAcquired).Token

	bc, bs := n.pair("b")
	n.accept(bs)
	b := watch("b", bc)
	sendFrames(t, bc, acquire("x", time.Minute))
	b.next(t, TypeWaiting)

	armed.Store(true)
	sendFrames(t, ac, heartbeat)
	tB := b.next(t, TypeAcquired).Token
	r := stop.returned(t)
	if r.info.RemoteAddr != "a" {
		t.Fatalf("ForceRelease ended %+v, want a", r.info)
	}
	expectStream(t, a, acquiredFrame(tA), errorFrame(CodeClosedByAdmin))
	shutdownNow(t, srv, served)
	expectStream(t, b, waitingFrame, acquiredFrame(tB), errorFrame(CodeShuttingDown))
	noWriteAfter(t, &n.log, r, "a")
	if t.Failed() {
		t.Logf("ForceRelease made %s; b was granted token %d; server log:%v", stop.where, tB, &n.log)
	}
}

// A waiter has been promoted and its push is about to be written when an
// administrator force-releases it: once ForceRelease has returned (and the
// next waiter has the lock), the push may not begin, only ERROR 0x02.
func TestNoPushAfterForceRelease(t *testing.T) {
	srv := &Server{IOTimeout: soon}
	n, served := serveProbes(t, srv)

	hc, hs := n.pair("h")
	n.accept(hs)
	h := watch("h", hc)
	sendFrames(t, hc, acquire("x", time.Minute))
	h.next(t, TypeAcquired)

	ac, as := n.pair("a")
	var armed atomic.Bool
	stop := newAdminStop(n, func() (SessionInfo, error) { return srv.ForceRelease("x", 0) })
	hookBeforeWrite(as, &armed, func() bool { return holderOf(srv, "x") == "a" }, stop)
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", time.Minute))
	a.next(t, TypeWaiting)

	bc, bs := n.pair("b")
	n.accept(bs)
	b := watch("b", bc)
	sendFrames(t, bc, acquire("x", time.Minute))
	b.next(t, TypeWaiting)

	armed.Store(true)
	hc.Close() // a is promoted; its push is held before its write
	tB := b.next(t, TypeAcquired).Token
	r := stop.returned(t)
	if r.info.RemoteAddr != "a" {
		t.Fatalf("ForceRelease ended %+v, want a", r.info)
	}
	expectStream(t, a, waitingFrame, errorFrame(CodeClosedByAdmin))
	shutdownNow(t, srv, served)
	expectStream(t, b, waitingFrame, acquiredFrame(tB), errorFrame(CodeShuttingDown))
	expectStream(t, h, acquiredAny)
	noWriteAfter(t, &n.log, r, "a")
	if t.Failed() {
		t.Logf("ForceRelease made %s; b was granted token %d; server log:%v", stop.where, tB, &n.log)
	}
}

// A waiter's HEARTBEAT has been read and checked, and its WAITING is about
// to be written, when an administrator kicks the waiter: once KickWaiter
// has returned, no reply may begin, only ERROR 0x02.
func TestNoHeartbeatReplyAfterKickWaiter(t *testing.T) {
	srv := &Server{IOTimeout: soon}
	n, served := serveProbes(t, srv)

	hc, hs := n.pair("h")
	n.accept(hs)
	h := watch("h", hc)
	sendFrames(t, hc, acquire("x", time.Minute))
	tH := h.next(t, TypeAcquired).Token

	ac, as := n.pair("a")
	var armed atomic.Bool
	stop := newAdminStop(n, func() (SessionInfo, error) { return srv.KickWaiter("x", "a") })
	hookBeforeWrite(as, &armed, func() bool { return true }, stop)
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", time.Minute))
	a.next(t, TypeWaiting)

	armed.Store(true)
	sendFrames(t, ac, heartbeat)
	r := stop.returned(t)
	expectStream(t, a, waitingFrame, errorFrame(CodeClosedByAdmin))
	shutdownNow(t, srv, served)
	expectStream(t, h, acquiredFrame(tH), errorFrame(CodeShuttingDown))
	noWriteAfter(t, &n.log, r, "a")
	if t.Failed() {
		t.Logf("KickWaiter made %s; server log:%v", stop.where, &n.log)
	}
}

// ForceRelease returns at once, and the released holder is told ERROR 0x02
// at once, even when the next waiter, promoted by it, does not read (its
// push cannot be written until the io-timeout). Fake time: 50ms is exact.
func TestForceReleaseDoesNotWaitForNextWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ioTimeout = 10 * time.Second
		srv := &Server{IOTimeout: ioTimeout}
		l := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		defer srv.Close()

		ac := l.dial("a")
		a := watch("a", ac)
		sendFrames(t, ac, acquire("x", time.Minute))
		tA := a.next(t, TypeAcquired).Token

		bc := l.dial("b") // b reads its WAITING, then nothing
		sendFrames(t, bc, acquire("x", time.Minute))
		if f, err := ReadFrame(bc); err != nil || f.Type != TypeWaiting {
			t.Fatalf("b: %+v, %v; want WAITING", f, err)
		}
		synctest.Wait() // a's and b's sessions wait for their next frame

		start := time.Now()
		returned := make(chan time.Duration, 1)
		go func() {
			if _, err := srv.ForceRelease("x", 0); err != nil {
				t.Errorf("ForceRelease: %v", err)
			}
			returned <- time.Since(start)
		}()
		var took time.Duration
		select {
		case took = <-returned:
		case <-time.After(time.Second):
			took = <-returned
		}
		if took > 50*time.Millisecond {
			t.Errorf("ForceRelease returned after %v (io-timeout %v): it waited for the next waiter, which does not read", took, ioTimeout)
		}
		got := expectStream(t, a, acquiredFrame(tA), errorFrame(CodeClosedByAdmin))
		if _, at := a.finish(t); len(got) == 2 {
			if d := at[1].Sub(start); d > 50*time.Millisecond {
				t.Errorf("a's ERROR 0x02 arrived %v after ForceRelease was called (io-timeout %v)", d, ioTimeout)
			}
		}
		bc.Close()
		shutdownNow(t, srv, served)
	})
}

// KickWaiter returns at once, and the kicked waiter is told ERROR 0x02 at
// once, while another waiter does not read; kicking the waiter that does
// not read returns at once too. Fake time: 50ms is exact.
func TestKickWaiterDoesNotWaitForSlowClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ioTimeout = 10 * time.Second
		srv := &Server{IOTimeout: ioTimeout}
		l := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		defer srv.Close()

		hc := l.dial("h")
		h := watch("h", hc)
		sendFrames(t, hc, acquire("x", time.Minute))
		tH := h.next(t, TypeAcquired).Token

		sc := l.dial("slow") // reads its WAITING, sends a HEARTBEAT, reads nothing more
		sendFrames(t, sc, acquire("x", time.Minute))
		if f, err := ReadFrame(sc); err != nil || f.Type != TypeWaiting {
			t.Fatalf("slow: %+v, %v; want WAITING", f, err)
		}
		sendFrames(t, sc, heartbeat)

		cc := l.dial("c")
		c := watch("c", cc)
		sendFrames(t, cc, acquire("x", time.Minute))
		c.next(t, TypeWaiting)
		synctest.Wait() // the reply to slow's heartbeat is blocked in its write

		kick := func(who string) time.Time {
			start := time.Now()
			returned := make(chan time.Duration, 1)
			go func() {
				if _, err := srv.KickWaiter("x", who); err != nil {
					t.Errorf("KickWaiter %s: %v", who, err)
				}
				returned <- time.Since(start)
			}()
			var took time.Duration
			select {
			case took = <-returned:
			case <-time.After(time.Second):
				took = <-returned
			}
			if took > 50*time.Millisecond {
				t.Errorf("KickWaiter(%s) returned after %v (io-timeout %v)", who, took, ioTimeout)
			}
			return start
		}
		start := kick("c")
		got := expectStream(t, c, waitingFrame, errorFrame(CodeClosedByAdmin))
		if _, at := c.finish(t); len(got) == 2 {
			if d := at[1].Sub(start); d > 50*time.Millisecond {
				t.Errorf("c's ERROR 0x02 arrived %v after KickWaiter was called (io-timeout %v)", d, ioTimeout)
			}
		}
		kick("slow")
		sc.Close()
		shutdownNow(t, srv, served)
		expectStream(t, h, acquiredFrame(tH), errorFrame(CodeShuttingDown))
	})
}

// After a write to a session has failed, nothing more is written to it:
// the stream may have ended mid-frame. Here the failed write is the push
// of a promotion, and the session has a second HEARTBEAT already read: its
// answer must never reach conn.Write.
func TestNoWriteAfterFailedPush(t *testing.T) {
	srv := &Server{IOTimeout: soon}
	n, served := serveProbes(t, srv)

	hc, hs := n.pair("h")
	n.accept(hs)
	h := watch("h", hc)
	sendFrames(t, hc, acquire("x", time.Minute))
	h.next(t, TypeAcquired)

	ac, as := n.pair("a")
	var armed, cutNext, cut, used atomic.Bool
	var writesAtArm atomic.Int64
	as.beforeSetRD = func() {
		// After the first heartbeat's answer, before the second is taken
		// up: h leaves, a is promoted, and its push is written (and fails).
		if !armed.Load() || as.writes.Load() <= writesAtArm.Load() || used.Swap(true) {
			return
		}
		defer n.enter()()
		cutNext.Store(true)
		n.log.mark("h closes")
		hc.Close()
		n.must("h to leave the table", func() bool { return holderOf(srv, "x") != "h" })
		// The push is written by another goroutine, which may already have
		// failed and ended a: a's grant is checked in Stats below.
		n.wait(time.Second, func() bool { return as.failed.Load() != 0 })
	}
	as.beforeWrite = func([]byte) {
		if cutNext.Load() && !cut.Swap(true) {
			n.log.mark("a's client goes away")
			ac.Close() // the write to a fails
		}
	}
	n.accept(as)
	a := watch("a", ac)
	sendFrames(t, ac, acquire("x", time.Minute))
	a.next(t, TypeWaiting)

	writesAtArm.Store(as.writes.Load())
	armed.Store(true)
	sendFrames(t, ac, heartbeat, heartbeat) // one write: the server reads both at once
	got, _ := a.finish(t)
	waitFor(t, "a and h to leave the table", func() bool { return srv.Stats().Connections == 0 })
	shutdownNow(t, srv, served)
	if len(got) < 1 || got[0].Type != TypeWaiting {
		t.Errorf("a received %s before it went away, want WAITING first", showFrames(got))
	}
	if !used.Load() {
		t.Fatalf("the server set no read deadline between a's two heartbeats: this test cannot place h's leave there; log:%v", &n.log)
	}
	failed := as.failed.Load()
	if failed == 0 {
		t.Fatalf("no write to a failed; log:%v", &n.log)
	}
	if after := as.writes.Load() - failed; after != 0 {
		t.Errorf("%d Write call(s) on a's connection after its write #%d (the push) failed", after, failed)
	}
	if g := srv.Stats().Grants; g != 2 {
		t.Errorf("%d grants, want 2: h's and a's by promotion", g)
	}
	expectStream(t, h, acquiredAny)
	if t.Failed() {
		t.Logf("server log:%v", &n.log)
	}
}

// Shutdown returns when its context ends, even while an Authorize callback
// is still running (for 3s here).
func TestShutdownDoesNotWaitForAuthorize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		var once sync.Once
		srv := &Server{IOTimeout: 10 * time.Second, Authorize: func(identity, lock string) bool {
			once.Do(func() { close(entered) })
			time.Sleep(3 * time.Second)
			return true
		}}
		l := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		defer srv.Close()

		cc := l.dial("c")
		c := watch("c", cc)
		sendFrames(t, cc, acquire("x", time.Minute))
		select {
		case <-entered:
		case <-time.After(time.Second):
			t.Fatal("Authorize was not called")
		}

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		returned := make(chan error, 1)
		go func() { returned <- srv.Shutdown(ctx) }()
		var err error
		select {
		case err = <-returned:
		case <-time.After(time.Second):
			err = <-returned
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Shutdown returned after %v; its context ended after 100ms (Authorize takes 3s)", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown = %v, want the context's error", err)
		}
		got, _ := c.finish(t)
		if len(got) > 1 || len(got) == 1 && (got[0].Type != TypeError || got[0].Code != CodeShuttingDown) {
			t.Errorf("c received %s, want nothing or [ERROR(0x01)]", showFrames(got))
		}
		cc.Close()
		select {
		case <-served:
		case <-time.After(soon):
			t.Errorf("Serve did not return")
		}
		time.Sleep(3 * time.Second) // Authorize returns, and its session ends
		synctest.Wait()
	})
}
