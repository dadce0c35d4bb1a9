package monolock

import (
	"bufio"
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// DefaultIOTimeout is the io-timeout of a Server whose IOTimeout is zero.
const DefaultIOTimeout = 5 * time.Second

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("monolock: server closed")

// Server serves the lock protocol on any number of listeners. The zero
// value is ready to use; its fields must not change once it serves.
type Server struct {
	// IOTimeout bounds the wait for a connection's first frame, the rest
	// of any frame once its first byte arrived, and every write.
	// Zero means DefaultIOTimeout.
	IOTimeout time.Duration

	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger

	// Authorize, if set, decides whether a client may acquire a lock; a
	// refused ACQUIRE is answered with ERROR 0x18. identity is the one of
	// the client's verified TLS certificate (see Identity), or empty. It
	// is called from the session's goroutine with no lock held.
	Authorize func(identity, lock string) bool

	closing atomic.Bool
	wg      sync.WaitGroup // one per session goroutine

	tlsHandshakeErrors atomic.Uint64

	mu        sync.Mutex // guards everything below; never held during I/O
	locks     map[string]*lock
	sessions  map[*session]struct{}
	listeners map[net.Listener]struct{}
	lastToken uint64
	done      chan struct{} // closed when shutdown begins
}

// lock exists only while it has a holder or waiters.
type lock struct {
	holder  *session
	waiters list.List // of *session, strict FIFO
}

// session is one connection. Its goroutine is the only reader of conn and
// the only one that removes it from the table; writes come from it and
// from whoever promotes it, serialized by wmu.
type session struct {
	srv      *Server
	conn     net.Conn
	identity string // from the client's certificate, set after the handshake
	name     string // set before the session joins the table

	lock *lock         // guarded by srv.mu
	elem *list.Element // guarded by srv.mu; non-nil while waiting

	// token is the grant's fencing token, 0 while waiting. It is written
	// under srv.mu and read under wmu, so a reply always reports the state
	// at the moment it is written.
	token atomic.Uint64

	wmu  sync.Mutex
	wbuf [9]byte // guarded by wmu
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

// initLocked allocates the maps on first use, so that the zero Server works.
func (srv *Server) initLocked() {
	if srv.locks == nil {
		srv.locks = make(map[string]*lock)
		srv.sessions = make(map[*session]struct{})
		srv.listeners = make(map[net.Listener]struct{})
		srv.done = make(chan struct{})
	}
}

// Serve accepts connections on l and serves each in its own goroutine
// until Shutdown or Close, then returns ErrServerClosed. Accept errors
// (EMFILE, ENFILE, ...) are logged and retried with a backoff of 5ms
// doubling to 1s; Serve returns another error only when l itself was
// closed by someone else.
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
	s := &session{srv: srv, conn: conn}
	srv.mu.Lock()
	if srv.closing.Load() {
		srv.mu.Unlock()
		conn.Close()
		return
	}
	srv.sessions[s] = struct{}{}
	srv.wg.Add(1)
	srv.mu.Unlock()
	go s.serve()
}

// Shutdown stops accepting, sends ERROR 0x01 to every session, holders and
// waiters alike, closes them and waits for their goroutines. No waiter is
// promoted once shutdown has begun. If ctx ends first, the remaining
// connections are closed at once and ctx's error is returned.
func (srv *Server) Shutdown(ctx context.Context) error {
	sessions := srv.beginClose()
	past := time.Unix(1, 0)
	for _, s := range sessions {
		// Wakes the session goroutine from its read; it sees closing and
		// sends 0x01 itself. See the loop in serve for why this cannot be
		// lost to a deadline that the goroutine sets at the same time.
		s.conn.SetReadDeadline(past)
	}
	finished := make(chan struct{})
	go func() {
		srv.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		srv.Close()
		<-finished
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once. A session
// that is between two frames at that moment may still be sent ERROR 0x01;
// the others get nothing. It does not wait for the session goroutines.
func (srv *Server) Close() error {
	for _, s := range srv.beginClose() {
		s.conn.Close()
	}
	return nil
}

// beginClose marks the server closing, closes the listeners and returns
// the sessions alive at that moment.
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
		sessions = append(sessions, s)
	}
	return sessions
}

// serve is the session's goroutine.
func (s *session) serve() {
	defer s.srv.wg.Done()
	why := s.run()
	s.end()
	if log := s.srv.log(); log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("session ended", "remote", s.conn.RemoteAddr().String(), "lock", s.name, "why", why)
	}
}

// Why a session ended, besides the errors it sent and the I/O errors.
var (
	errExpired   = errors.New("silent for longer than its lease")
	errIOTimeout = errors.New("io-timeout")
)

// run reads and answers frames until the session ends, and says why.
func (s *session) run() error {
	srv := s.srv
	r := bufio.NewReaderSize(s.conn, 64) // an ACQUIRE with a short name in one read
	ioTimeout := srv.ioTimeout()
	var lease time.Duration // zero until the ACQUIRE is accepted
	if tc, ok := s.conn.(*tls.Conn); ok {
		// Explicitly, so that a client that stalls the handshake meets the
		// io-timeout like any other, and the identity is known before the
		// first frame.
		tc.SetDeadline(time.Now().Add(ioTimeout))
		if err := tc.Handshake(); err != nil {
			srv.tlsHandshakeErrors.Add(1)
			return fmt.Errorf("TLS handshake: %w", err)
		}
		s.identity = Identity(tc.ConnectionState())
	}
	deadline := time.Now().Add(ioTimeout)
	for {
		s.conn.SetReadDeadline(deadline)
		// Checked after setting the deadline: Shutdown sets closing before
		// it sets a past deadline, so either this sees closing or Shutdown's
		// deadline overrides ours.
		if srv.closing.Load() {
			return s.fail(ErrShuttingDown)
		}
		typ, err := r.ReadByte()
		switch {
		case err == nil:
		case srv.closing.Load():
			return s.fail(ErrShuttingDown)
		case isTimeout(err) && lease != 0:
			return errExpired
		case isTimeout(err):
			return errIOTimeout
		default:
			return err // EOF or reset: the client is gone
		}
		seen := time.Now() // lastSeenAt, if the frame turns out valid
		switch {
		case typ == TypeHeartbeat && lease == 0:
			return s.fail(ErrAcquireFirst)
		case typ == TypeHeartbeat:
			if err := s.writeState(); err != nil {
				return err
			}
		case typ == TypeAcquire && lease != 0:
			return s.fail(ErrDuplicateAcquire)
		case typ == TypeAcquire:
			s.conn.SetReadDeadline(time.Now().Add(ioTimeout))
			f, err := readAcquire(r)
			if isTimeout(err) {
				return errIOTimeout
			} else if err != nil {
				return s.fail(err)
			}
			if srv.Authorize != nil && !srv.Authorize(s.identity, f.Name) {
				return s.fail(fmt.Errorf("%w %q", ErrNotAuthorized, f.Name))
			}
			seen = time.Now()
			lease = time.Duration(f.LeaseMS) * time.Millisecond
			s.name = f.Name
			if err := srv.acquire(s); err != nil {
				return err
			}
		default:
			return s.fail(unknownType(typ))
		}
		deadline = seen.Add(lease)
	}
}

// Identity returns the client's identity from a TLS connection's state:
// the first URI SAN of its verified certificate, else the first DNS SAN,
// else the Common Name. Without a verified client certificate it is empty.
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

// acquire makes s the holder or the last waiter of its lock and writes the
// answer. wmu is held from before the table changes until the answer is
// written, so a promotion that races it is pushed after the WAITING.
func (srv *Server) acquire(s *session) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	srv.mu.Lock()
	if srv.closing.Load() {
		srv.mu.Unlock()
		return s.writeErrorLocked(ErrShuttingDown)
	}
	l := srv.locks[s.name]
	if l == nil {
		l = &lock{}
		srv.locks[s.name] = l
	}
	s.lock = l
	var token uint64
	if l.holder == nil {
		l.holder = s
		token = srv.nextTokenLocked()
		s.token.Store(token)
	} else {
		s.elem = l.waiters.PushBack(s)
	}
	srv.mu.Unlock()
	// The answer is the state decided above, not a reload of s.token: a
	// promotion since then gets its own push, and answering ACQUIRED here
	// too would leave the client one ACQUIRED it cannot tell from a reply.
	if token == 0 {
		return s.writeLocked(append(s.wbuf[:0], TypeWaiting))
	}
	return s.writeAcquiredLocked(token)
}

// nextTokenLocked returns the next fencing token: above every token this
// process gave, and at least the wall clock in nanoseconds, so that a
// restarted server continues above its predecessor as long as the clock
// did not step back in between. Never 0.
func (srv *Server) nextTokenLocked() uint64 {
	t := srv.lastToken + 1
	if now := time.Now().UnixNano(); now > 0 && uint64(now) > t {
		t = uint64(now)
	}
	srv.lastToken = t
	return t
}

// end removes s from the table and, if it held its lock, promotes the
// head waiter, whose goroutine is busy with its own reads, by pushing
// ACQUIRED from here. Closing s waits until after the push: the table
// already says who holds, and the waiter should not wait for a syscall.
func (s *session) end() {
	defer s.conn.Close()
	srv := s.srv
	srv.mu.Lock()
	delete(srv.sessions, s)
	var next *session
	var token uint64
	if l := s.lock; l != nil {
		if l.holder == s {
			l.holder = nil
			if front := l.waiters.Front(); front != nil && !srv.closing.Load() {
				next = l.waiters.Remove(front).(*session)
				next.elem = nil
				l.holder = next
				token = srv.nextTokenLocked()
				next.token.Store(token)
			}
		} else {
			l.waiters.Remove(s.elem)
			s.elem = nil
		}
		if l.holder == nil && l.waiters.Len() == 0 {
			delete(srv.locks, s.name)
		}
	}
	srv.mu.Unlock()
	if next != nil {
		next.push(token)
	}
}

// push sends the promotion's ACQUIRED. A waiter that cannot take it is
// closed; its own goroutine then ends it, which promotes the next one.
func (s *session) push(token uint64) {
	s.wmu.Lock()
	err := s.writeAcquiredLocked(token)
	s.wmu.Unlock()
	if err != nil {
		s.conn.Close()
	}
}

// writeState answers a HEARTBEAT with the session's state.
func (s *session) writeState() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.writeStateLocked()
}

func (s *session) writeStateLocked() error {
	token := s.token.Load()
	if token == 0 {
		return s.writeLocked(append(s.wbuf[:0], TypeWaiting))
	}
	return s.writeAcquiredLocked(token)
}

func (s *session) writeAcquiredLocked(token uint64) error {
	b, _ := Frame{Type: TypeAcquired, Token: token}.AppendBinary(s.wbuf[:0])
	return s.writeLocked(b)
}

// fail sends the ERROR frame for err when err carries a code, and returns
// err; the session then ends, which closes the connection.
func (s *session) fail(err error) error {
	if _, ok := codeOf(err); ok {
		s.wmu.Lock()
		defer s.wmu.Unlock()
		s.writeErrorLocked(err)
	}
	return err
}

func (s *session) writeErrorLocked(err error) error {
	code, _ := codeOf(err)
	reason := err.Error()
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
	return err
}
