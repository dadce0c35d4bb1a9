package monolock

import (
	"cmp"
	"container/list"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The rules the code keeps (docs/sessions.md explains the design), each
// with the one place that enforces it:
//
//  1. srv.mu guards the table and the fields of a session marked so; every
//     function that touches them is named ...Locked or takes srv.mu, and
//     none does network I/O with it held.
//  2. Frames are decided only by owe (answers) and endLocked (the final
//     ERROR), only for a live session.
//  3. drainLocked alone writes, on the goroutine holding the writer's role,
//     taken only by wakeLocked and drainOwnLocked.
//  4. endLocked is the only way out of the table; stopLocked, another
//     party's end, first drops what was decided and not yet taken.
//  5. After a stop, no write but the final ERROR begins: drainLocked checks
//     stopped after its deadline, cutLocked's caller sets a past one.
//  6. The bytes of one read are decided together, by heartbeatLocked in
//     the critical section that ends the session if one is bad.
//  7. promoteLocked grants only a waiter whose lease has not passed.
//  8. wakeLocked starts a writer for what another party decided: nobody
//     waits on another session's socket.
//  9. emitLocked queues events with the table change they describe.

// DefaultIOTimeout is the io-timeout of a Server whose IOTimeout is zero.
const DefaultIOTimeout = 5 * time.Second

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("monolock: server closed")

// Server serves the lock protocol on any number of listeners. The zero
// value is ready to use; its fields must not change once it serves.
type Server struct {
	// IOTimeout bounds the first frame's wait, the rest of a frame once
	// begun, the TLS handshake and every write. Zero: DefaultIOTimeout.
	IOTimeout time.Duration

	// Logger receives diagnostics, if set. Failed TLS handshakes and refused
	// ACQUIREs are logged at info, at most once a second each, counting skips.
	Logger *slog.Logger

	// Authorize, if set, decides whether a client may acquire a lock (else
	// ERROR 0x18); identity is that of its verified TLS certificate (see
	// Identity), or empty. Called with no lock held, it must return
	// promptly: Shutdown waits for it until its ctx ends.
	Authorize func(identity, lock string) bool

	// OnEvent, if set, is told of every grant, release, denial and admin
	// action, one call at a time in table order (a release before the
	// lock's next grant), on a server goroutine with no lock held. Up to
	// 16384 events wait while it is busy; more are dropped and counted in
	// Stats.EventsDropped. Shutdown waits for them until its ctx ends.
	OnEvent func(Event)

	closing                 atomic.Bool
	wg                      sync.WaitGroup // session goroutines and writers
	eventWG                 sync.WaitGroup // the event goroutine, while there is one
	handshakeLog, denialLog infoLimit

	mu         sync.Mutex // guards everything below and every session's state (rule 1)
	locks      map[string]*lock
	sessions   map[*session]struct{} // until their connection is closed
	listeners  map[net.Listener]struct{}
	lastToken  uint64
	done       chan struct{} // closed when shutdown begins
	counts     Stats         // all but the gauges
	events     []Event       // not yet delivered
	delivering bool          // an event goroutine runs
}

// maxQueuedEvents bounds the memory a stalled OnEvent can hold.
const maxQueuedEvents = 1 << 14

// lock exists only while it has a holder or waiters.
type lock struct {
	holder  *session
	waiters list.List // of *session, strict FIFO
}

// A session's phase only moves forward.
type phase uint8

const (
	phaseHandshake phase = iota // TLS: no frame can be written yet
	phaseConnected              // reading the ACQUIRE
	phaseWaiting
	phaseHolding
	phaseEnding // out of the table: only its final frame and the close remain
	phaseClosed
)

// session is one connection. Its goroutine (one at a time: see serve)
// alone reads conn; drain writes it.
type session struct {
	srv      *Server
	conn     net.Conn
	remote   string
	identity string        // from the client's certificate, set after the handshake
	name     string        // set before the session joins the table
	lease    time.Duration // likewise

	// Guarded by srv.mu (rule 1).
	phase phase
	lock  *lock         // holder's or waiter's lock, until endLocked
	elem  *list.Element // non-nil while waiting
	since time.Time     // queued at, then granted at
	seen  time.Time     // lastSeenAt: the read of the last valid frame
	token uint64        // of the grant; 0 while waiting

	// The outbox, written in this order: no WAITING is ever decided after
	// an ACQUIRED, as the phase only moves forward.
	owedWaiting, owedAcquired uint32
	final                     error       // the final ERROR's cause, while ending
	writing                   bool        // a goroutine has the writer's role
	stopped                   atomic.Bool // stopLocked ended it; read without srv.mu by drain only
	wbuf                      [9]byte

	rbuf [32]byte // read ahead; the session goroutine's own
	r, w uint8    // the unread part of rbuf
}

func (srv *Server) ioTimeout() time.Duration {
	if srv.IOTimeout > 0 {
		return srv.IOTimeout
	}
	return DefaultIOTimeout
}

var discard = slog.New(slog.DiscardHandler)

func (srv *Server) log() *slog.Logger {
	if srv.Logger != nil {
		return srv.Logger
	}
	return discard
}

// infoLimit lets one kind of info line through once a second, counting
// those left out: a flood of bad clients must not flood the log.
type infoLimit struct{ next, left atomic.Int64 }

func (srv *Server) infoLimited(lim *infoLimit, msg string, args ...any) {
	now, next := time.Now().UnixNano(), lim.next.Load()
	if now < next || !lim.next.CompareAndSwap(next, now+int64(time.Second)) {
		lim.left.Add(1)
		return
	}
	if left := lim.left.Swap(0); left > 0 {
		args = append(args, "suppressed", left)
	}
	srv.log().Info(msg, args...)
}

// initLocked allocates the maps on first use, so that the zero Server works.
func (srv *Server) initLocked() {
	if srv.locks == nil {
		srv.locks = make(map[string]*lock)
		srv.sessions = make(map[*session]struct{})
		srv.listeners = make(map[net.Listener]struct{})
		srv.counts.Releases = map[string]uint64{ReasonGraceful: 0, ReasonExpired: 0, ReasonIOTimeout: 0, ReasonForce: 0}
		srv.counts.Errors = map[Code]uint64{}
		srv.done = make(chan struct{})
	}
}

// Serve serves connections from l until Shutdown or Close, then returns
// ErrServerClosed. Accept errors (EMFILE, ...) are logged and retried
// after 5ms doubling to 1s; another error means l was closed by others.
func (srv *Server) Serve(l net.Listener) error {
	srv.mu.Lock()
	srv.initLocked()
	if srv.closing.Load() {
		srv.mu.Unlock()
		return ErrServerClosed
	}
	srv.listeners[l] = struct{}{}
	done := srv.done
	srv.mu.Unlock()
	defer func() {
		srv.mu.Lock()
		delete(srv.listeners, l)
		srv.mu.Unlock()
	}()

	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if srv.closing.Load() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			srv.mu.Lock()
			srv.counts.AcceptErrors++
			srv.mu.Unlock()
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			srv.log().Error("accept failed; retrying", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-done:
			}
			continue
		}
		delay = 0
		srv.start(conn)
	}
}

func (srv *Server) start(conn net.Conn) {
	s := &session{srv: srv, conn: conn, remote: conn.RemoteAddr().String()}
	if _, ok := conn.(*tls.Conn); !ok {
		s.phase = phaseConnected
	}
	srv.mu.Lock()
	srv.counts.ConnectionsAccepted++
	if srv.closing.Load() {
		srv.mu.Unlock()
		closeConn(conn)
		return
	}
	srv.sessions[s] = struct{}{}
	srv.wg.Add(1)
	srv.mu.Unlock()
	go s.serve()
}

// Shutdown stops accepting, sends ERROR 0x01 to every session, promoting
// no waiter, and waits for them, closing at once those not done within an
// io-timeout (a client that does not read); then for OnEvent. If ctx ends
// first, it closes every connection and returns ctx's error at once.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	listeners, stopped := srv.beginCloseLocked()
	for s := range srv.sessions {
		srv.wakeLocked(s)
	}
	srv.mu.Unlock()
	closeAll(listeners, stopped)
	finished := make(chan struct{})
	go func() { srv.wg.Wait(); srv.eventWG.Wait(); close(finished) }()
	bound := time.NewTimer(srv.ioTimeout())
	defer bound.Stop()
	select {
	case <-finished:
		return nil
	case <-bound.C:
		srv.Close()
	case <-ctx.Done():
		srv.Close()
		return ctx.Err()
	}
	select {
	case <-finished: // soon after Close, unless Authorize or OnEvent is slow
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once, without
// waiting.
func (srv *Server) Close() error {
	srv.mu.Lock()
	listeners, _ := srv.beginCloseLocked()
	for s := range srv.sessions {
		s.phase = phaseClosed
		listeners = append(listeners, s.conn)
	}
	clear(srv.sessions)
	srv.mu.Unlock()
	closeAll(listeners, nil)
	return nil
}

// beginCloseLocked marks the server closing and ends every session
// without promoting anyone. It returns the listeners, to close, and the
// sessions it stopped, whose writes to cut (see cutLocked).
func (srv *Server) beginCloseLocked() (listeners []io.Closer, cut []*session) {
	srv.initLocked()
	if !srv.closing.Swap(true) {
		close(srv.done)
	}
	for l := range srv.listeners {
		listeners = append(listeners, l)
	}
	for s := range srv.sessions {
		if s.phase < phaseEnding {
			srv.stopLocked(s, ErrShuttingDown)
			if srv.cutLocked(s) {
				cut = append(cut, s)
			}
		}
	}
	return listeners, cut
}

// closeAll closes cs, raw, and cuts the writes of sessions, outside srv.mu.
func closeAll(cs []io.Closer, sessions []*session) {
	for _, c := range cs {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn() // no close_notify, which may wait on a client that does not read
		}
		c.Close()
	}
	for _, s := range sessions {
		s.conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// closeConn skips TLS's close_notify, which waits up to 5 s for a client
// that does not read: the protocol's last word is ERROR or the close.
func closeConn(c net.Conn) { closeAll([]io.Closer{c}, nil) }

// Why a session ended, besides the errors it sent and the I/O errors.
var (
	errExpired   = errors.New("silent for longer than its lease")
	errIOTimeout = errors.New("io-timeout")
	errUnread    = errors.New("more than 65536 answers unread")
	errEnded     = errors.New("ended by another") // Shutdown, an administrator, a failed write
	errEndedHere = errors.New("ended in acquire") // not an end: acquire has ended the session
)

const (
	maxOwed    = 1 << 16          // what a session may owe while a writer is stuck on it
	floodPause = time.Millisecond // a byte, after a read of more than one: see run
)

// serve handshakes and reads the ACQUIRE; once the session joined the
// table, a fresh goroutine takes it over. The first frame is the deepest
// work, and Go does not shrink a stack back while it waits in a read: the
// handover keeps an idle session's stack at 2 KiB instead of 4 KiB.
func (s *session) serve() {
	if tc, ok := s.conn.(*tls.Conn); ok {
		if err := s.handshake(tc); err != nil {
			s.end(err)
			return
		}
	}
	switch err := s.acquire(); err {
	case nil:
		go s.run()
	case errEndedHere:
	default:
		s.end(err)
	}
}

// handshake is explicit so that a client stalling it meets the io-timeout,
// and the identity is known before the first frame.
func (s *session) handshake(tc *tls.Conn) error {
	srv := s.srv
	tc.SetDeadline(time.Now().Add(srv.ioTimeout()))
	err := tc.Handshake()
	srv.mu.Lock()
	stopped := s.phase >= phaseEnding
	if !stopped && err != nil {
		srv.counts.TLSHandshakeErrors++
	} else if !stopped {
		s.phase = phaseConnected
	}
	srv.mu.Unlock()
	if err != nil {
		if !stopped {
			srv.infoLimited(&srv.handshakeLog, "TLS handshake failed", "remote", s.remote, "err", err)
		}
		return fmt.Errorf("TLS handshake: %w", err)
	}
	s.identity = Identity(tc.ConnectionState())
	return nil
}

// acquire reads the first frame, which must be a valid ACQUIRE, checks it,
// and joins the table.
func (s *session) acquire() error {
	srv := s.srv
	s.conn.SetReadDeadline(time.Now().Add(srv.ioTimeout()))
	n, err := s.conn.Read(s.rbuf[:])
	if n == 0 {
		if isTimeout(err) {
			return errIOTimeout
		}
		return err
	}
	s.r, s.w = 1, uint8(n)
	switch typ := s.rbuf[0]; typ {
	case TypeHeartbeat:
		return ErrAcquireFirst
	case TypeAcquire:
	default:
		return unknownType(typ)
	}
	s.conn.SetReadDeadline(time.Now().Add(srv.ioTimeout())) // the rest of a begun frame
	f, err := readAcquire(s)
	if isTimeout(err) {
		return errIOTimeout
	} else if err != nil {
		return err
	}
	read := time.Now() // lastSeenAt
	s.name = f.Name
	if srv.Authorize != nil && !srv.Authorize(s.identity, f.Name) {
		srv.mu.Lock()
		if s.phase < phaseEnding {
			srv.counts.Denials++
			srv.emitLocked(Event{Type: EventDenied}, s)
		}
		srv.mu.Unlock()
		srv.infoLimited(&srv.denialLog, "ACQUIRE not authorized", "identity", s.identity, "lock", f.Name, "remote", s.remote)
		return fmt.Errorf("%w %q", ErrNotAuthorized, f.Name)
	}
	s.lease = time.Duration(f.LeaseMS) * time.Millisecond
	beats, bad := s.scan() // decided with the ACQUIRE: the same answers however segmented
	srv.mu.Lock()
	if err := srv.joinLocked(s, read); err != nil {
		srv.mu.Unlock()
		return err
	}
	if why := srv.heartbeatLocked(s, beats, read, bad); why != nil {
		s.endOwnLocked(why)
		return errEndedHere
	}
	s.drainOwnLocked(true)
	return nil
}

// Read is io.Reader through the session's buffer, for the rest of a frame.
func (s *session) Read(p []byte) (int, error) {
	if s.r == s.w {
		return s.conn.Read(p)
	}
	n := copy(p, s.rbuf[s.r:s.w])
	s.r += uint8(n)
	return n, nil
}

// run reads and answers heartbeats until the session ends: at most
// len(rbuf) bytes at a time, answered in one write before the next read,
// so a client that does not read is held back by its own socket. After a
// read of more than one byte, which a client with one heartbeat in flight
// never causes, the goroutine sleeps floodPause a byte: a flood is
// answered at most a thousand heartbeats a second, and leaves the
// processors idle often enough for the runtime to poll the network for
// everyone else.
func (s *session) run() {
	srv := s.srv
	srv.mu.Lock()
	deadline, alive := s.seen.Add(s.lease), s.phase < phaseEnding
	srv.mu.Unlock()
	if !alive { // ended while its first answer was written
		s.end(nil)
		return
	}
	for {
		var pause time.Duration
		if s.r == s.w {
			s.conn.SetReadDeadline(deadline)
			n, err := s.conn.Read(s.rbuf[:])
			if n == 0 {
				if isTimeout(err) {
					err = errExpired
				}
				s.end(err)
				return
			}
			if s.r, s.w = 0, uint8(n); n > 1 {
				pause = time.Duration(n) * floodPause
			}
		}
		now := time.Now()
		beats, bad := s.scan()
		srv.mu.Lock()
		if why := srv.heartbeatLocked(s, beats, now, bad); why != nil {
			s.endOwnLocked(why) // in the same critical section: no promotion between
			return
		}
		s.drainOwnLocked(true)
		deadline = now.Add(s.lease)
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

// scan takes what rbuf holds after the ACQUIRE: the heartbeats, then the
// error of a bad frame if one follows (nothing after it counts).
func (s *session) scan() (beats int, bad error) {
	for ; s.r < s.w && s.rbuf[s.r] == TypeHeartbeat; s.r++ {
		beats++
	}
	if s.r < s.w {
		bad = unknownType(s.rbuf[s.r])
		if s.rbuf[s.r] == TypeAcquire {
			bad = ErrDuplicateAcquire
		}
		s.r = s.w
	}
	return beats, bad
}

// end ends the session for a cause its own goroutine met, if not ended
// already, writes what it owes (drain then closes) and retires. After a
// promotion it first yields, so that the push's writer goroutine, likely
// next on this processor, goes before this session's own close: a
// handover then takes no longer than with the push written inline.
func (s *session) end(why error) {
	s.srv.mu.Lock()
	s.endOwnLocked(why)
}

// endOwnLocked is end with srv.mu held, which it releases.
func (s *session) endOwnLocked(why error) {
	srv := s.srv
	grants := srv.counts.Grants
	srv.endLocked(s, why)
	if srv.counts.Grants != grants {
		srv.mu.Unlock()
		runtime.Gosched()
		srv.mu.Lock()
	}
	s.drainOwnLocked(true)
	if log := srv.log(); log.Enabled(context.Background(), slog.LevelDebug) { // no allocations per session otherwise
		log.Debug("session ended", "remote", s.remote, "lock", s.name, "why", why)
	}
	srv.wg.Done()
}

// Identity is the first URI SAN of a verified client certificate, else its
// first DNS SAN, else its Common Name; without one, empty.
func Identity(cs tls.ConnectionState) string {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return ""
	}
	cert := cs.PeerCertificates[0]
	switch {
	case len(cert.URIs) > 0:
		return cert.URIs[0].String()
	case len(cert.DNSNames) > 0:
		return cert.DNSNames[0]
	}
	return cert.Subject.CommonName
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// joinLocked makes s its lock's holder or last waiter and decides the
// answer, unless Shutdown ended s or its lease passed meanwhile.
func (srv *Server) joinLocked(s *session, read time.Time) error {
	switch {
	case s.phase >= phaseEnding:
		return ErrShuttingDown
	case time.Since(read) >= s.lease: // Authorize took the whole lease
		return errExpired
	}
	srv.counts.Acquires++
	l := srv.locks[s.name]
	if l == nil {
		l = &lock{}
		srv.locks[s.name] = l
	}
	s.lock, s.seen, s.since = l, read, time.Now()
	if l.holder == nil {
		srv.grantLocked(l, s)
	} else {
		s.phase = phaseWaiting
		s.elem = l.waiters.PushBack(s)
		s.owe(1)
	}
	return nil
}

// heartbeatLocked decides the answers to beats heartbeats read at now,
// then to bad, a bad frame, if set; it returns why s must end, or nil.
func (srv *Server) heartbeatLocked(s *session, beats int, now time.Time, bad error) error {
	switch {
	case s.phase >= phaseEnding:
		return errEnded
	case now.Sub(s.seen) >= s.lease: // the frame came too late, as a read deadline would say
		return errExpired
	}
	if owed := int(s.owedWaiting + s.owedAcquired); owed+beats > maxOwed {
		beats, bad = maxOwed-owed, errUnread
	}
	if beats > 0 {
		s.seen = now
		s.owe(beats)
		srv.counts.Heartbeats += uint64(beats)
	}
	return bad
}

// owe decides n answers with s's state, WAITING or ACQUIRED (rule 2); its
// caller holds srv.mu and has checked that s is alive.
func (s *session) owe(n int) {
	if s.phase == phaseWaiting {
		s.owedWaiting += uint32(n)
	} else {
		s.owedAcquired += uint32(n)
	}
}

// grantLocked makes s the holder of l with a fresh token and owes ACQUIRED.
func (srv *Server) grantLocked(l *lock, s *session) {
	now := time.Now()
	wait := now.Sub(s.since)
	l.holder, s.since, s.phase = s, now, phaseHolding
	s.token = srv.nextTokenLocked(now)
	s.owe(1)
	srv.counts.Grants++
	srv.counts.WaitTotal += wait
	srv.emitLocked(Event{Type: EventGranted, Token: s.token, Wait: wait}, s)
}

// nextTokenLocked is above every token given and at least now in Unix ns:
// a restart continues above the last token unless the clock went back.
func (srv *Server) nextTokenLocked(now time.Time) uint64 {
	t := srv.lastToken + 1
	if ns := now.UnixNano(); ns > 0 && uint64(ns) > t {
		t = uint64(ns)
	}
	srv.lastToken = t
	return t
}

// endLocked takes s out of the table, once, whatever the cause (rule 4):
// a holder's lock goes to the next live waiter, unless closing. It decides
// the final ERROR when why has a code; drain then closes.
func (srv *Server) endLocked(s *session, why error) {
	if s.phase >= phaseEnding {
		return
	}
	if s.phase == phaseHandshake {
		why = nil // a frame now would only start another handshake
	}
	s.phase, s.final = phaseEnding, nil
	if _, ok := codeOf(why); ok {
		s.final = why
	} else { // an end without a word: nothing more is written
		s.owedWaiting, s.owedAcquired = 0, 0
	}
	l := s.lock
	if l == nil {
		return
	}
	s.lock = nil
	if l.holder == s {
		l.holder = nil
		held, reason := time.Since(s.since), releaseReason(why)
		srv.counts.Releases[reason]++
		srv.counts.HoldTotal += held
		srv.emitLocked(Event{Type: EventReleased, Token: s.token, Held: held, Reason: reason}, s)
		if !srv.closing.Load() {
			srv.promoteLocked(l)
		}
	} else {
		l.waiters.Remove(s.elem)
		s.elem = nil
	}
	if l.holder == nil && l.waiters.Len() == 0 {
		delete(srv.locks, s.name)
	}
}

// stopLocked ends s by another party's decision (Shutdown, an
// administrator, a failed write, a promoter), dropping what s was owed.
func (srv *Server) stopLocked(s *session, why error) {
	if s.phase < phaseEnding {
		s.owedWaiting, s.owedAcquired = 0, 0
		s.stopped.Store(true)
		srv.endLocked(s, why)
	}
}

// promoteLocked grants l to its first waiter whose lease has not passed
// by the server's clock (rule 7), ending those before it as expired.
func (srv *Server) promoteLocked(l *lock) {
	for front := l.waiters.Front(); front != nil; front = l.waiters.Front() {
		next := l.waiters.Remove(front).(*session)
		next.elem = nil
		if time.Since(next.seen) >= next.lease {
			next.lock = nil // out of the queue already
			srv.stopLocked(next, errExpired)
			srv.wakeLocked(next)
			continue
		}
		srv.grantLocked(l, next)
		srv.wakeLocked(next)
		return
	}
}

// wakeLocked gets what another party decided for s written (rule 8): by
// the writer at work, which gives up its role only with nothing owed, or
// by a goroutine of its own. The decider never waits on s's socket.
func (srv *Server) wakeLocked(s *session) {
	if !s.writing {
		s.writing = true
		srv.wg.Add(1)
		go func() {
			srv.mu.Lock()
			s.drainLocked(false)
			srv.wg.Done()
		}()
	}
}

// drainOwnLocked writes, on the session's goroutine, what it decided for
// itself, unless a writer is at work already and will. It unlocks srv.mu.
func (s *session) drainOwnLocked(own bool) {
	if s.writing {
		s.srv.mu.Unlock()
		return
	}
	s.writing = true
	s.drainLocked(own)
}

// The reasons of a release.
const (
	ReasonGraceful  = "graceful"   // the client closed, broke the protocol, or the server shut down
	ReasonExpired   = "expired"    // silent for longer than its lease
	ReasonIOTimeout = "io_timeout" // a frame or a write took longer than the io-timeout
	ReasonForce     = "force"      // an administrator's ForceRelease
)

func releaseReason(why error) string {
	switch {
	case errors.Is(why, ErrClosedByAdmin):
		return ReasonForce
	case errors.Is(why, errExpired):
		return ReasonExpired
	case errors.Is(why, errIOTimeout), isTimeout(why):
		return ReasonIOTimeout
	}
	return ReasonGraceful
}

// drainLocked is the one writer (rule 3), on the goroutine holding the
// role, called with srv.mu held, which it releases: it takes what s is
// owed, writes it with srv.mu released, and repeats until nothing is left,
// then closes the connection of an ending session. A batch taken before
// stopLocked and not yet begun is dropped (rule 5): stopped is checked
// after the deadline is set, and a stopper sets a past deadline after the
// stop (cutLocked), so a write either sees the stop or fails before its
// own deadline with nothing sent; the stream is then whole, and a final
// ERROR in that write is owed again. After any other failed write nothing
// more is written: the stream may have ended inside a frame.
func (s *session) drainLocked(own bool) {
	srv := s.srv
	for {
		b, fin, due := s.takeLocked(own)
		if b == nil {
			s.writing = false
			closing := s.phase == phaseEnding
			if closing {
				s.phase = phaseClosed
				delete(srv.sessions, s)
			}
			srv.mu.Unlock()
			if closing {
				closeConn(s.conn)
			}
			return
		}
		stopped := s.stopped.Load()
		srv.mu.Unlock()
		s.conn.SetWriteDeadline(due)
		late := s.stopped.Load() && !stopped
		n, err := 0, error(nil)
		if !late {
			n, err = s.conn.Write(b)
		}
		if cap(b) == maxBatch {
			batches.Put((*[maxBatch]byte)(b[:maxBatch]))
		}
		srv.mu.Lock()
		switch code, _ := codeOf(fin); {
		case err == nil && fin != nil:
			srv.counts.Errors[code]++
		case err != nil && n == 0 && isTimeout(err) && time.Now().Before(due): // cut
			s.final = cmp.Or(s.final, fin)
		case err != nil:
			alive := s.phase == phaseWaiting || s.phase == phaseHolding // then lease is set
			if isTimeout(err) {
				err = errIOTimeout
				if alive && time.Since(s.seen) >= s.lease {
					err = errExpired
				}
			}
			srv.stopLocked(s, err)
			s.owedWaiting, s.owedAcquired, s.final = 0, 0, nil
		}
	}
}

// maxBatch bounds one write: a flood is answered in turns.
const maxBatch = 1024

var batches = sync.Pool{New: func() any { return new([maxBatch]byte) }}

// takeLocked takes from the outbox, in order, what fits in one write, and
// returns its bytes (nil for none), the final ERROR's cause if they end
// with it, and the write's deadline: the io-timeout, or on the session's
// own goroutine (own) the end of a live session's lease if sooner: a
// client that neither reads nor sends is silent. (Another writer's
// deadline would not follow the lease as heartbeats move it.)
func (s *session) takeLocked(own bool) (b []byte, fin error, due time.Time) {
	if s.phase == phaseClosed {
		return nil, nil, due
	}
	size := int(s.owedWaiting) + 9*int(s.owedAcquired)
	if s.final != nil {
		size += 3 + MaxReasonLen
	}
	switch {
	case size == 0:
		return nil, nil, due
	case size <= len(s.wbuf):
		b = s.wbuf[:0]
	default:
		b = batches.Get().(*[maxBatch]byte)[:0]
	}
	for ; s.owedWaiting > 0 && len(b) < maxBatch; s.owedWaiting-- {
		b = append(b, TypeWaiting)
	}
	for ; s.owedWaiting == 0 && s.owedAcquired > 0 && len(b)+9 <= maxBatch; s.owedAcquired-- {
		b = binary.BigEndian.AppendUint64(append(b, TypeAcquired), s.token)
	}
	if s.final != nil && s.owedWaiting == 0 && s.owedAcquired == 0 && len(b)+3+MaxReasonLen <= maxBatch {
		fin, s.final = s.final, nil
		code, _ := codeOf(fin)
		reason := fin.Error()
		reason = strings.ToValidUTF8(reason[:min(len(reason), MaxReasonLen)], "") // a cut rune goes
		b, _ = Frame{Type: TypeError, Code: code, Reason: reason}.AppendBinary(b)
	}
	due = time.Now().Add(s.srv.ioTimeout())
	if own && (s.phase == phaseWaiting || s.phase == phaseHolding) { // then lease is set
		if until := s.seen.Add(s.lease); until.Before(due) {
			due = until
		}
	}
	return b, fin, due
}

// Event is what OnEvent is told. Type says which of the fields are set.
type Event struct {
	Type       string // one of the Event constants
	Time       time.Time
	Lock       string
	Identity   string // of the session the event is about
	RemoteAddr string
	Token      uint64        // granted, released, force_release
	Wait       time.Duration // granted: time in the queue
	Held       time.Duration // released: time held
	Reason     string        // released: one of the Reason constants
}

// The types of events.
const (
	EventGranted      = "granted"
	EventReleased     = "released"
	EventDenied       = "denied"        // Authorize refused an ACQUIRE
	EventForceRelease = "force_release" // ForceRelease; the release follows
	EventKickWaiter   = "kick_waiter"
)

// emitLocked queues ev, about s, for OnEvent (rule 9); one goroutine at a
// time delivers them, outside srv.mu.
func (srv *Server) emitLocked(ev Event, s *session) {
	if srv.OnEvent == nil {
		return
	}
	if len(srv.events) >= maxQueuedEvents {
		srv.counts.EventsDropped++
		return
	}
	ev.Time, ev.Lock, ev.Identity, ev.RemoteAddr = time.Now(), s.name, s.identity, s.remote
	srv.events = append(srv.events, ev)
	if !srv.delivering {
		srv.delivering = true
		srv.eventWG.Add(1)
		go srv.deliver()
	}
}

func (srv *Server) deliver() {
	defer srv.eventWG.Done()
	for {
		srv.mu.Lock()
		batch := srv.events
		srv.events = nil
		if len(batch) == 0 {
			srv.delivering = false
			srv.mu.Unlock()
			return
		}
		srv.mu.Unlock()
		for _, ev := range batch {
			srv.OnEvent(ev)
		}
	}
}

// Stats are the server's counters and gauges at one moment.
type Stats struct {
	Connections int // open connections, with or without a lock
	LocksHeld   int
	Waiters     int

	ConnectionsAccepted uint64
	AcceptErrors        uint64
	TLSHandshakeErrors  uint64
	Acquires            uint64 // valid, authorized ACQUIREs: granted or queued
	Denials             uint64 // ACQUIREs that Authorize refused (not those Shutdown ended meanwhile)
	Heartbeats          uint64
	Grants              uint64            // immediate or by promotion
	Releases            map[string]uint64 // of held locks, by Reason
	Errors              map[Code]uint64   // ERROR frames written whole, by code
	EventsDropped       uint64            // events that OnEvent was never told of: see OnEvent
	WaitTotal           time.Duration     // summed over Grants
	HoldTotal           time.Duration     // summed over Releases
}

// Stats returns the current counters.
func (srv *Server) Stats() Stats {
	srv.mu.Lock()
	srv.initLocked()
	defer srv.mu.Unlock()
	st := srv.counts
	st.Releases, st.Errors = maps.Clone(st.Releases), maps.Clone(st.Errors)
	st.Connections = len(srv.sessions)
	for _, l := range srv.locks {
		if l.holder != nil {
			st.LocksHeld++
		}
		st.Waiters += l.waiters.Len()
	}
	return st
}

// SessionInfo describes a holder or a waiter.
type SessionInfo struct {
	Identity   string
	RemoteAddr string
	Since      time.Time // granted at (holder) or queued at (waiter)
	Lease      time.Duration
	Token      uint64 // holder only
}

// LockInfo describes a lock that has a holder or waiters.
type LockInfo struct {
	Name    string
	Holder  *SessionInfo // nil only while the server shuts down
	Waiters []SessionInfo
}

// Locks returns a snapshot of every lock with a holder or waiters, by name.
func (srv *Server) Locks() []LockInfo {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	infos := make([]LockInfo, 0, len(srv.locks))
	for name, l := range srv.locks {
		infos = append(infos, l.infoLocked(name))
	}
	slices.SortFunc(infos, func(a, b LockInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos
}

// Lock returns the lock called name, or false when nobody holds or waits for it.
func (srv *Server) Lock(name string) (LockInfo, bool) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	l := srv.locks[name]
	if l == nil {
		return LockInfo{}, false
	}
	return l.infoLocked(name), true
}

func (l *lock) infoLocked(name string) LockInfo {
	info := LockInfo{Name: name, Waiters: make([]SessionInfo, 0, l.waiters.Len())}
	if l.holder != nil {
		h := l.holder.infoLocked()
		info.Holder = &h
	}
	for e := l.waiters.Front(); e != nil; e = e.Next() {
		info.Waiters = append(info.Waiters, e.Value.(*session).infoLocked())
	}
	return info
}

func (s *session) infoLocked() SessionInfo {
	return SessionInfo{Identity: s.identity, RemoteAddr: s.remote, Since: s.since, Lease: s.lease, Token: s.token}
}

// Errors of ForceRelease and KickWaiter.
var (
	ErrNotFound   = errors.New("monolock: no such holder or waiter")
	ErrStaleToken = errors.New("monolock: the lock is held under another token")
)

// ForceRelease ends the holder of name under token (0: any): it leaves the
// table at once, the next waiter is promoted, and it is sent ERROR 0x02 and
// closed. It returns the holder; another token ends nobody: ErrStaleToken.
func (srv *Server) ForceRelease(name string, token uint64) (SessionInfo, error) {
	return srv.kick(name, EventForceRelease, func(l *lock) (*session, error) {
		switch h := l.holder; {
		case h == nil:
			return nil, ErrNotFound
		case token != 0 && h.token != token:
			return nil, ErrStaleToken
		}
		return l.holder, nil
	})
}

// KickWaiter ends the waiter of name at remoteAddr: it leaves the queue at
// once, unpromoted, and is sent ERROR 0x02 and closed.
func (srv *Server) KickWaiter(name, remoteAddr string) (SessionInfo, error) {
	return srv.kick(name, EventKickWaiter, func(l *lock) (*session, error) {
		for e := l.waiters.Front(); e != nil; e = e.Next() {
			if s := e.Value.(*session); s.remote == remoteAddr {
				return s, nil
			}
		}
		return nil, ErrNotFound
	})
}

// kick ends the session find picks, under srv.mu like every end, and
// returns without waiting for its socket or its successor's (rule 8);
// after it, no write but the final ERROR begins (cutLocked).
func (srv *Server) kick(name, event string, find func(*lock) (*session, error)) (SessionInfo, error) {
	srv.mu.Lock()
	s, err := (*session)(nil), ErrNotFound
	if l := srv.locks[name]; l != nil && !srv.closing.Load() {
		s, err = find(l)
	}
	if err != nil {
		srv.mu.Unlock()
		return SessionInfo{}, err
	}
	info := s.infoLocked()
	srv.emitLocked(Event{Type: event, Token: info.Token}, s)
	srv.stopLocked(s, ErrClosedByAdmin)
	cut := srv.cutLocked(s)
	srv.wakeLocked(s)
	srv.mu.Unlock()
	if cut {
		closeAll(nil, []*session{s})
	}
	return info, nil
}

// cutLocked, right after stopLocked(s), reports whether a write s's writer
// took before the stop may still begin; the caller then sets a past write
// deadline, after unlocking (see drainLocked). Not over TLS, which keeps
// any write error for good and so would lose the final ERROR: there the
// check of stopped after the deadline is all, and a write that passed it
// an instant before the stop may still begin.
func (srv *Server) cutLocked(s *session) bool {
	_, isTLS := s.conn.(*tls.Conn)
	return s.writing && !isTLS
}
