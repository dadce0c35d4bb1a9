package monolock

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The rules the code below keeps; where it relies on one, it names it.
//
//  1. Lock order: s.wmu, then srv.mu. No network I/O while srv.mu is held.
//  2. A session's token changes from 0 once, under srv.mu, at its grant.
//  3. s.lock != nil means s is its lock's holder or in its queue.
//  4. A session ends on one path, end: it leaves the table (promoting the
//     next waiter), writes its final frame, closes. Shutdown and
//     administrators take it out of the table themselves; out of it, no
//     promotion reaches it and no token is spent on it.
//  5. After the final frame or a failed write, nothing is written (final,
//     under wmu). A session Shutdown or an administrator took out (stop)
//     gets only its final frame: no push decided before, no late answer.
//  6. Shutdown and administrators set s.stop under srv.mu, then a past read
//     deadline. Whoever re-arms a read deadline checks s.stop afterwards, so
//     either it sees the flag or the past deadline overrides its own.
//  7. Events are queued under srv.mu with the table change they describe, so
//     they keep the table's order and are queued before wg.Wait returns.

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
	// promptly: Shutdown waits for it.
	Authorize func(identity, lock string) bool

	// OnEvent, if set, is told of every grant, release, denial and admin
	// action, one call at a time in table order (a release before the
	// lock's next grant), on a server goroutine with no lock held. Up to
	// 16384 events wait while it is busy; more are dropped and counted in
	// Stats.EventsDropped. Shutdown waits for them until its ctx ends.
	OnEvent func(Event)

	closing atomic.Bool
	wg      sync.WaitGroup // one per session, until end
	eventWG sync.WaitGroup // the event goroutine, while there is one

	accepted, acceptErrors, tlsHandshakeErrors atomic.Uint64
	acquires, denials, heartbeats              atomic.Uint64
	protocolErrors                             [256]atomic.Uint64 // ERROR frames sent, by code
	handshakeLog, denialLog                    infoLimit

	mu         sync.Mutex // guards everything below; never held during I/O
	locks      map[string]*lock
	sessions   map[*session]struct{}
	listeners  map[net.Listener]struct{}
	lastToken  uint64
	done       chan struct{} // closed when shutdown begins
	counts     Stats         // Grants, Releases, WaitTotal, HoldTotal, EventsDropped
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

// session is one connection. Its goroutine (one at a time: see serve)
// alone reads conn; it and its promoter write, serialized by wmu.
type session struct {
	srv      *Server
	conn     net.Conn
	remote   string
	identity string        // from the client's certificate, set after the handshake
	name     string        // set before the session joins the table
	lease    time.Duration // likewise
	stop     atomic.Uint32 // the Code that Shutdown or an administrator ended it with (rule 6)
	wtimeout atomic.Bool   // a write took longer than the io-timeout

	lock  *lock         // guarded by srv.mu (rule 3)
	elem  *list.Element // guarded by srv.mu; non-nil while waiting
	since time.Time     // guarded by srv.mu: queued at, then granted at

	// token is 0 while waiting (rule 2); written under srv.mu and read under
	// wmu, so a reply reports the state at the moment it is written.
	token atomic.Uint64

	wmu   sync.Mutex
	final bool // guarded by wmu (rule 5)
	wbuf  [9]byte

	rbuf [32]byte // read ahead, so that an ACQUIRE with a short name takes one read
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

// infoLimit lets one kind of info line through once a second: a flood of
// bad clients must not flood the log.
type infoLimit struct {
	mu   sync.Mutex
	next time.Time
	left int // lines left out since the last one
}

func (srv *Server) infoLimited(lim *infoLimit, msg string, args ...any) {
	lim.mu.Lock()
	now := time.Now()
	if now.Before(lim.next) {
		lim.left++
		lim.mu.Unlock()
		return
	}
	lim.next = now.Add(time.Second)
	if lim.left > 0 {
		args = append(args, "suppressed", lim.left)
		lim.left = 0
	}
	lim.mu.Unlock()
	srv.log().Info(msg, args...)
}

// initLocked allocates the maps on first use, so that the zero Server works.
func (srv *Server) initLocked() {
	if srv.locks == nil {
		srv.locks = make(map[string]*lock)
		srv.sessions = make(map[*session]struct{})
		srv.listeners = make(map[net.Listener]struct{})
		srv.counts.Releases = map[string]uint64{ReasonGraceful: 0, ReasonExpired: 0, ReasonIOTimeout: 0, ReasonForce: 0}
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
			srv.acceptErrors.Add(1)
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
	srv.accepted.Add(1)
	s := &session{srv: srv, conn: conn, remote: conn.RemoteAddr().String()}
	srv.mu.Lock()
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
// first, it closes what is still open and returns ctx's error.
func (srv *Server) Shutdown(ctx context.Context) error {
	for _, s := range srv.beginClose() {
		s.conn.SetReadDeadline(time.Unix(1, 0)) // rule 6: its goroutine sends 0x01 and ends
	}
	finished := waitChan(&srv.wg)
	bound := time.NewTimer(srv.ioTimeout())
	defer bound.Stop()
	select {
	case <-finished:
	case <-bound.C:
		srv.Close()
		<-finished // at once: every connection is closed
	case <-ctx.Done():
		srv.Close()
		<-finished
		return ctx.Err()
	}
	select {
	case <-waitChan(&srv.eventWG):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func waitChan(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// Close stops accepting and closes every connection at once; a session
// between two frames may still be sent ERROR 0x01. It does not wait.
func (srv *Server) Close() error {
	for _, s := range srv.beginClose() {
		closeConn(s.conn)
	}
	return nil
}

// beginClose marks the server closing, closes the listeners, takes every
// session out of the table without promoting anyone, and returns them.
func (srv *Server) beginClose() []*session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.initLocked()
	if !srv.closing.Swap(true) {
		close(srv.done)
	}
	for l := range srv.listeners {
		l.Close() // not network I/O: it only releases the descriptor
	}
	sessions := make([]*session, 0, len(srv.sessions))
	for s := range srv.sessions {
		srv.stopLocked(s, CodeShuttingDown)
		sessions = append(sessions, s)
	}
	return sessions
}

// closeConn skips TLS's close_notify, which waits up to 5 s for a client
// that does not read: the protocol's last word is ERROR or the close.
func closeConn(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	c.Close()
}

// serve handshakes and reads the ACQUIRE; once the session joined the
// table, a fresh goroutine takes it over. The first frame is the deepest
// work, and Go does not shrink a stack back while it waits in a read: the
// handover keeps an idle session's stack at 2 KiB instead of 4 KiB.
func (s *session) serve() {
	if tc, ok := s.conn.(*tls.Conn); ok {
		if err := s.handshake(tc); err != nil {
			s.final = true // a frame now would only start another handshake
			s.end(err)
			return
		}
	}
	deadline, why := s.run(0, time.Now().Add(s.srv.ioTimeout()))
	if why != errJoined {
		s.end(why)
		return
	}
	go func() { // owns the session from here on
		_, why := s.run(s.lease, deadline)
		s.end(why)
	}()
}

// stopped is the error Shutdown or an administrator ended s with, or nil.
func (s *session) stopped() error {
	if code := s.stop.Load(); code != 0 {
		return Code(code).Err()
	}
	return nil
}

// Why a session ended, besides the errors it sent and the I/O errors.
var (
	errExpired   = errors.New("silent for longer than its lease")
	errIOTimeout = errors.New("io-timeout")
	errJoined    = errors.New("joined the table") // not an end: see serve
)

// run reads and answers frames, the next one due by deadline, until the
// session must end, and says why; before the ACQUIRE (lease 0) it returns
// errJoined and the next deadline once the session joined the table.
func (s *session) run(lease time.Duration, deadline time.Time) (next time.Time, why error) {
	for {
		s.conn.SetReadDeadline(deadline)
		if err := s.stopped(); err != nil { // rule 6
			return deadline, err
		}
		if s.r == s.w { // the only place an idle session waits
			n, err := s.conn.Read(s.rbuf[:])
			if n == 0 {
				switch {
				case isTimeout(err) && lease != 0:
					err = errExpired
				case isTimeout(err):
					err = errIOTimeout
				}
				return deadline, err
			}
			s.r, s.w = 0, uint8(n)
		}
		typ := s.rbuf[s.r]
		s.r++
		seen := time.Now() // lastSeenAt, if the frame turns out valid
		switch {
		case typ == TypeHeartbeat && lease == 0:
			return deadline, ErrAcquireFirst
		case typ == TypeHeartbeat:
			s.srv.heartbeats.Add(1)
			if err := s.writeState(); err != nil {
				return deadline, err
			}
		case typ == TypeAcquire && lease != 0:
			return deadline, ErrDuplicateAcquire
		case typ == TypeAcquire:
			if err := s.acquire(); err != nil {
				return deadline, err
			}
			return time.Now().Add(s.lease), errJoined
		default:
			return deadline, unknownType(typ)
		}
		deadline = seen.Add(lease)
	}
}

// handshake is explicit so that a client stalling it meets the io-timeout,
// and the identity is known before the first frame.
func (s *session) handshake(tc *tls.Conn) error {
	tc.SetDeadline(time.Now().Add(s.srv.ioTimeout()))
	if err := s.stopped(); err != nil { // rule 6
		return err
	}
	if err := tc.Handshake(); err != nil {
		if s.stopped() == nil {
			s.srv.tlsHandshakeErrors.Add(1)
			s.srv.infoLimited(&s.srv.handshakeLog, "TLS handshake failed", "remote", s.remote, "err", err)
		}
		return fmt.Errorf("TLS handshake: %w", err)
	}
	s.identity = Identity(tc.ConnectionState())
	return nil
}

// acquire reads the rest of an ACQUIRE, checks it, and joins the table.
func (s *session) acquire() error {
	srv := s.srv
	s.conn.SetReadDeadline(time.Now().Add(srv.ioTimeout()))
	if err := s.stopped(); err != nil { // rule 6
		return err
	}
	f, err := readAcquire(s)
	if isTimeout(err) {
		return errIOTimeout
	} else if err != nil {
		return err
	}
	s.name = f.Name
	if srv.Authorize != nil && !srv.Authorize(s.identity, f.Name) {
		srv.denials.Add(1)
		srv.mu.Lock()
		srv.emitLocked(Event{Type: EventDenied}, s)
		srv.mu.Unlock()
		srv.infoLimited(&srv.denialLog, "ACQUIRE not authorized", "identity", s.identity, "lock", f.Name, "remote", s.remote)
		return fmt.Errorf("%w %q", ErrNotAuthorized, f.Name)
	}
	s.lease = time.Duration(f.LeaseMS) * time.Millisecond
	srv.acquires.Add(1)
	return srv.join(s)
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

// join makes s its lock's holder or last waiter and answers, holding wmu
// from before the change (rule 1): a racing promotion comes after WAITING.
func (srv *Server) join(s *session) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	srv.mu.Lock()
	if err := s.stopped(); err != nil { // Shutdown passed this session by: rule 6
		srv.mu.Unlock()
		return err
	}
	l := srv.locks[s.name]
	if l == nil {
		l = &lock{}
		srv.locks[s.name] = l
	}
	s.lock = l
	s.since = time.Now()
	var token uint64
	if l.holder == nil {
		token = srv.grantLocked(l, s)
	} else {
		s.elem = l.waiters.PushBack(s)
	}
	srv.mu.Unlock()
	// Not a reload of s.token: a promotion since has its own push, and a
	// second ACQUIRED here could not be told from a reply.
	return s.writeStateLocked(token)
}

// grantLocked makes s the holder of l with a fresh token (rule 2).
func (srv *Server) grantLocked(l *lock, s *session) uint64 {
	now := time.Now()
	wait := now.Sub(s.since)
	l.holder, s.since = s, now
	token := srv.nextTokenLocked(now)
	s.token.Store(token)
	srv.counts.Grants++
	srv.counts.WaitTotal += wait
	srv.emitLocked(Event{Type: EventGranted, Token: token, Wait: wait}, s)
	return token
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

// end is the one way a session ends (rule 4), on its last goroutine.
func (s *session) end(why error) {
	srv := s.srv
	if err := s.stopped(); err != nil {
		why = err // whatever else went wrong came of being stopped
	} else if s.wtimeout.Load() {
		why = errIOTimeout // a push to it failed, and closed the connection
	}
	srv.mu.Lock()
	next, token := srv.leaveLocked(s, why)
	srv.mu.Unlock()
	if next != nil {
		next.push(token)
	}
	s.wmu.Lock()
	if code, ok := codeOf(why); ok && !s.final {
		srv.protocolErrors[code].Add(1)
		s.writeErrorLocked(code, why.Error())
	}
	s.final = true
	s.wmu.Unlock()
	closeConn(s.conn)
	srv.mu.Lock()
	delete(srv.sessions, s) // only now: Close must reach a final frame's write
	srv.mu.Unlock()
	if log := srv.log(); log.Enabled(context.Background(), slog.LevelDebug) { // no allocations per session otherwise
		log.Debug("session ended", "remote", s.remote, "lock", s.name, "why", why)
	}
	srv.wg.Done()
}

// leaveLocked takes s out of the table, once (rule 3). The head waiter it
// promotes, never while closing, is returned for a push outside srv.mu.
func (srv *Server) leaveLocked(s *session, why error) (next *session, token uint64) {
	l := s.lock
	if l == nil {
		return nil, 0
	}
	s.lock = nil
	if l.holder == s {
		l.holder = nil
		held, reason := time.Since(s.since), releaseReason(why)
		srv.counts.Releases[reason]++
		srv.counts.HoldTotal += held
		srv.emitLocked(Event{Type: EventReleased, Token: s.token.Load(), Held: held, Reason: reason}, s)
		if front := l.waiters.Front(); front != nil && !srv.closing.Load() {
			next = l.waiters.Remove(front).(*session)
			next.elem = nil
			token = srv.grantLocked(l, next)
		}
	} else {
		l.waiters.Remove(s.elem)
		s.elem = nil
	}
	if l.holder == nil && l.waiters.Len() == 0 {
		delete(srv.locks, s.name)
	}
	return next, token
}

// stopLocked ends s for Shutdown and administrators (rule 4); the caller
// then wakes its goroutine with a past read deadline (rule 6).
func (srv *Server) stopLocked(s *session, code Code) (next *session, token uint64) {
	s.stop.CompareAndSwap(0, uint32(code))
	return srv.leaveLocked(s, code.Err())
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

// push sends a promotion's ACQUIRED (rule 5). A waiter that cannot take it
// is closed; its goroutine then ends it, promoting the next.
func (s *session) push(token uint64) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if !s.final && s.stop.Load() == 0 && s.writeStateLocked(token) != nil {
		closeConn(s.conn)
	}
}

func (s *session) writeState() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.stopped(); err != nil { // rule 5
		return err
	}
	return s.writeStateLocked(s.token.Load())
}

// writeStateLocked writes ACQUIRED with token, or WAITING for token 0.
func (s *session) writeStateLocked(token uint64) error {
	f := Frame{Type: TypeAcquired, Token: token}
	if token == 0 {
		f.Type = TypeWaiting
	}
	b, _ := f.AppendBinary(s.wbuf[:0])
	return s.writeLocked(b)
}

func (s *session) writeErrorLocked(code Code, reason string) error {
	if len(reason) > MaxReasonLen {
		cut := MaxReasonLen
		for !utf8.RuneStart(reason[cut]) {
			cut-- // keep the reason valid UTF-8
		}
		reason = reason[:cut]
	}
	b, _ := Frame{Type: TypeError, Code: code, Reason: reason}.AppendBinary(nil)
	return s.writeLocked(b)
}

func (s *session) writeLocked(b []byte) error {
	s.conn.SetWriteDeadline(time.Now().Add(s.srv.ioTimeout()))
	_, err := s.conn.Write(b)
	if err != nil {
		s.final = true // the stream may end mid-frame: rule 5
		s.wtimeout.Store(isTimeout(err))
	}
	return err
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

// emitLocked queues ev, about s, for OnEvent (rule 7); one goroutine at a
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
	Denials             uint64 // ACQUIREs that Authorize refused
	Heartbeats          uint64
	Grants              uint64            // immediate or by promotion
	Releases            map[string]uint64 // of held locks, by Reason
	Errors              map[Code]uint64   // ERROR frames sent, by code
	EventsDropped       uint64            // events that OnEvent was never told of: see OnEvent
	WaitTotal           time.Duration     // summed over Grants
	HoldTotal           time.Duration     // summed over Releases
}

// Stats returns the current counters.
func (srv *Server) Stats() Stats {
	srv.mu.Lock()
	srv.initLocked()
	st := srv.counts
	st.Releases = maps.Clone(st.Releases)
	st.Connections = len(srv.sessions)
	for _, l := range srv.locks {
		if l.holder != nil {
			st.LocksHeld++
		}
		st.Waiters += l.waiters.Len()
	}
	srv.mu.Unlock()
	st.ConnectionsAccepted, st.AcceptErrors = srv.accepted.Load(), srv.acceptErrors.Load()
	st.TLSHandshakeErrors, st.Acquires = srv.tlsHandshakeErrors.Load(), srv.acquires.Load()
	st.Denials, st.Heartbeats = srv.denials.Load(), srv.heartbeats.Load()
	st.Errors = map[Code]uint64{}
	for code := range srv.protocolErrors {
		if n := srv.protocolErrors[code].Load(); n > 0 {
			st.Errors[Code(code)] = n
		}
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
	return SessionInfo{Identity: s.identity, RemoteAddr: s.remote, Since: s.since, Lease: s.lease, Token: s.token.Load()}
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
		case token != 0 && h.token.Load() != token:
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
	next, token := srv.stopLocked(s, CodeClosedByAdmin)
	srv.mu.Unlock()
	if next != nil {
		next.push(token)
	}
	s.conn.SetReadDeadline(time.Unix(1, 0)) // rule 6
	return info, nil
}
