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
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The rules, each kept at one place (docs/sessions.md has the design):
//
//  1. srv.mu guards the table and a session's marked fields; whoever touches
//     them is named ...Locked or takes srv.mu, and does no I/O with it held
//     (setting a deadline is not I/O: it never waits).
//  2. Frames are decided only by owe, for a live session, and endLocked,
//     for one not yet ending.
//  3. drainLocked alone writes frames, holding the writer's role, which
//     only wakeLocked and drainOwnLocked hand out (crypto/tls writes its
//     own records, a KeyUpdate's answer or an alert, inside a read).
//  4. endLocked is the only way out of the table; dropLocked, called by it
//     and by stopLocked for another party's end, drops what was decided and
//     not yet taken, unless the session's own bad frame ended it.
//  5. After a drop no write begins but the final ERROR and, before it, the
//     rest of a cut frame: dropLocked sets a past write deadline, and
//     drainLocked checks stopped after its own and, over a NewTLSListener's
//     connection, once crypto/tls cannot write from the read (awaitIdle).
//  6. heartbeatLocked decides one read's bytes together, in the critical
//     section that ends the session if one is bad.
//  7. promoteLocked grants only a waiter whose lease has not passed.
//  8. wakeLocked writes what others decided: nobody waits on another's socket.
//  9. emitLocked queues an event with the table change it describes.
// 10. A live session's lease ends at leaseEndLocked, the one source of every
//     lease deadline and check, judged by the clock read under srv.mu;
//     whoever meets a session past it ends it as expired, with no frame:
//     the deadlines of run's read, takeLocked (its own writes) and
//     watchLeaseLocked (TLS, another's write); heartbeatLocked and
//     joinLocked before they decide; endLocked, given an end without a
//     code (a close, a failed write); and expireLocked for those who find
//     it (promoteLocked, kick, Shutdown, another's writer at each take).
// 11. A session's goroutine alone reads it, but for linger: after its final
//     ERROR, its writer half-closes and reads on, beneath TLS, by a
//     deadline of its own, until the client closes, a timer's close or
//     Close.

// DefaultIOTimeout is the io-timeout of a Server whose IOTimeout is zero.
const DefaultIOTimeout = 5 * time.Second

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("monolock: server closed")

var errNoConn = errors.New("the listener returned neither a connection nor an error")

// Server serves the lock protocol on any number of listeners. The zero
// value is ready to use; its fields must not change once it serves.
type Server struct {
	// IOTimeout bounds the first frame's wait, the rest of a frame once
	// begun, the TLS handshake and every write, but a session's own (by its
	// lease's end if sooner) and TLS's inside its read (by its lease's end).
	// Zero: DefaultIOTimeout.
	IOTimeout time.Duration

	// Logger, if set, receives diagnostics; failed TLS handshakes and
	// refused ACQUIREs at info, at most once a second each. Its handler
	// must not block: Shutdown waits for it until its ctx ends.
	Logger *slog.Logger

	// Authorize, if set, decides whether a client may acquire a lock (else
	// ERROR 0x18); identity is that of its verified TLS certificate (see
	// Identity), or empty. Called with no lock held, it must return
	// promptly: Shutdown waits for it until its ctx ends (so call Shutdown
	// from it only on another goroutine).
	Authorize func(identity, lock string) bool

	// OnEvent, if set, is told of every grant, release, denial and admin
	// action, one call at a time in table order, with no lock held. Up to
	// 16384 events not yet told are held for it, the one it is being told
	// included; more are dropped (Stats.EventsDropped), but for those of
	// Shutdown and Close, one a session at most, always held. It must
	// return (a panic ends the process; a goroutine it ends, as t.FailNow
	// would, ends delivery). Shutdown waits for the events until its ctx
	// ends (as for Authorize, call Shutdown from it only on another
	// goroutine).
	OnEvent func(Event)

	closing                 atomic.Bool
	wg                      sync.WaitGroup // session goroutines, writers, the event goroutine
	handshakeLog, denialLog infoLimit

	mu         sync.Mutex // guards everything below and every session's state (rule 1)
	locks      map[string]*lock
	sessions   map[*session]struct{}      // until their connection is closed
	listeners  map[*net.Listener]struct{} // by Serve's own variable: a listener's type may not be comparable
	lastToken  uint64
	done       chan struct{} // closed when shutdown begins
	counts     Stats         // all but the gauges
	events     []Event       // queued for the event goroutine
	delivering bool          // an event goroutine runs

	// untold counts the events queued or in the batch being told, less
	// those told: the bound's count. Only emitLocked adds to it, under mu,
	// so a check then an add cannot overshoot; deliver counts each event
	// down as it is told, without mu, so OnEvent keeping up never drops.
	untold atomic.Int64
}

const maxQueuedEvents = 1 << 14 // the memory a stalled OnEvent can hold

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

// session is one connection: its goroutine reads (and linger), drainLocked writes.
type session struct {
	srv      *Server
	conn     net.Conn
	tls      *tls.Conn // conn over TLS, else nil
	remote   string
	identity string        // from the client's certificate, set after the handshake
	name     string        // set before the session joins the table
	lease    time.Duration // likewise

	// Guarded by srv.mu (rule 1).
	phase phase
	lock  *lock         // holder's or waiter's lock, until endLocked
	elem  *list.Element // non-nil while waiting
	since time.Time     // queued at, then granted at
	seen  time.Time     // lastSeenAt: the ACQUIRE's read, then each HEARTBEAT's decision
	token uint64        // of the grant; 0 while waiting

	// The outbox, written in the order of deciding: the phase only moves forward.
	owedWaiting, owedAcquired uint32
	final                     error       // the final ERROR's cause, while ending
	leaseWatch                *time.Timer // while another goroutine writes over TLS
	stopped                   atomic.Bool // dropLocked ran; read without srv.mu by drainLocked only
	writing                   bool        // a goroutine has the writer's role (here: no padding)

	rbuf [32]byte // read ahead; the session goroutine's own
	r, w uint8    // the unread part of rbuf
}

// meter is the recordConn under s's TLS, from NewTLSListener, or nil.
func (s *session) meter() *recordConn {
	if s.tls == nil {
		return nil
	}
	m, _ := s.tls.NetConn().(*recordConn)
	return m
}

// live: s is in the table, so its lease is set.
func (s *session) live() bool { return s.phase == phaseWaiting || s.phase == phaseHolding }

// leaseEndLocked is when s's lease ends unless a valid frame is read
// first: every deadline and check of the lease is taken from it (rule 10).
func (s *session) leaseEndLocked() time.Time { return s.seen.Add(s.lease) }

func (s *session) expiredLocked(now time.Time) bool { return !now.Before(s.leaseEndLocked()) }

func (srv *Server) ioTimeout() time.Duration {
	if srv.IOTimeout > 0 {
		return srv.IOTimeout
	}
	return DefaultIOTimeout
}

var discard = slog.New(slog.DiscardHandler)

func (srv *Server) log() *slog.Logger { return cmp.Or(srv.Logger, discard) }

// infoLimit lets one kind of line through once a second, with the count
// of those left out: a flood of bad clients must not flood the log.
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

// initLocked makes the zero Server work.
func (srv *Server) initLocked() {
	if srv.locks == nil {
		srv.locks = make(map[string]*lock)
		srv.sessions = make(map[*session]struct{})
		srv.listeners = make(map[*net.Listener]struct{})
		srv.counts.Releases = map[string]uint64{ReasonGraceful: 0, ReasonExpired: 0, ReasonIOTimeout: 0, ReasonForce: 0}
		srv.counts.Errors = map[Code]uint64{}
		srv.done = make(chan struct{})
	}
}

// Serve serves connections from l until Shutdown or Close, then returns
// ErrServerClosed with l closed. Accept errors (EMFILE, ...) are retried
// after 5ms doubling to 1s; net.ErrClosed (l closed by others) is returned.
func (srv *Server) Serve(l net.Listener) error {
	srv.mu.Lock()
	srv.initLocked()
	if srv.closing.Load() {
		srv.mu.Unlock()
		l.Close() // else the kernel accepts on it for nobody
		return ErrServerClosed
	}
	srv.listeners[&l] = struct{}{}
	done := srv.done
	srv.mu.Unlock()
	defer func() {
		srv.mu.Lock()
		delete(srv.listeners, &l)
		srv.mu.Unlock()
	}()
	for delay := time.Duration(0); ; {
		conn, err := l.Accept()
		if conn == nil && err == nil {
			err = errNoConn
		}
		switch {
		case err == nil:
			delay = 0
			srv.start(conn)
			continue
		case srv.closing.Load():
			return ErrServerClosed
		case errors.Is(err, net.ErrClosed):
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
	}
}

func (srv *Server) start(conn net.Conn) {
	s := &session{srv: srv, conn: conn}
	if a := conn.RemoteAddr(); a != nil { // a listener's wrapper may know none
		s.remote = a.String()
	}
	if s.tls, _ = conn.(*tls.Conn); s.tls == nil {
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

// Shutdown stops accepting, sends ERROR 0x01 to every session not already
// ending (but one in its TLS handshake, closed, and one past its lease,
// closed as expired), promoting nobody, and waits for them, each until its
// client closes after the ERROR, a second at most (closing those not done
// in an io-timeout), and for OnEvent. When ctx ends it closes all
// and returns ctx's error.
func (srv *Server) Shutdown(ctx context.Context) error {
	srv.mu.Lock()
	listeners := srv.beginCloseLocked()
	for s := range srv.sessions {
		srv.wakeLocked(s)
	}
	srv.mu.Unlock()
	closeAll(listeners)
	finished := make(chan struct{})
	go func() { srv.wg.Wait(); close(finished) }()
	bound := time.AfterFunc(srv.ioTimeout(), func() { srv.Close() })
	defer bound.Stop()
	select {
	case <-finished: // soon after Close, unless Authorize or OnEvent is slow
		return nil
	case <-ctx.Done():
		srv.Close()
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once.
func (srv *Server) Close() error {
	srv.mu.Lock()
	listeners := srv.beginCloseLocked()
	for s := range srv.sessions {
		s.phase = phaseClosed
		listeners = append(listeners, s.conn)
	}
	clear(srv.sessions)
	srv.mu.Unlock()
	closeAll(listeners)
	return nil
}

// beginCloseLocked ends every session, promoting nobody, and returns the
// listeners to close.
func (srv *Server) beginCloseLocked() (listeners []io.Closer) {
	srv.initLocked()
	if !srv.closing.Swap(true) {
		close(srv.done)
	}
	for l := range srv.listeners {
		listeners = append(listeners, *l)
	}
	for s := range srv.sessions {
		if !srv.expireLocked(s) {
			srv.stopLocked(s, ErrShuttingDown)
		}
	}
	return listeners
}

// closeAll closes cs without TLS's close_notify, which may wait on a
// client that does not read.
func closeAll(cs []io.Closer) {
	for _, c := range cs {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		c.Close()
	}
}

func closeConn(c net.Conn) { closeAll([]io.Closer{c}) }

// NewTLSListener is tls.NewListener(inner, config) that lets Serve see
// the TLS records under each connection: crypto/tls reads records it
// never returns (TLS 1.3 KeyUpdates, 16 in a row, each answered with a
// write of the server's), which the flood rate must charge, and the
// writes it makes from a read, which a frame's write must not wait behind
// (rule 5). Over another TLS listener a client can have the server answer
// 16 KeyUpdates for each read the rate counts, and a frame decided before
// a session's end written up to an io-timeout after it.
func NewTLSListener(inner net.Listener, config *tls.Config) net.Listener {
	return tls.NewListener(recordListener{inner}, config)
}

type recordListener struct{ net.Listener }

func (l recordListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newRecordConn(c), nil
}

func newRecordConn(c net.Conn) *recordConn {
	rc := &recordConn{Conn: c}
	rc.idle.L = &rc.bmu
	return rc
}

// ownConn is a connection of this package's, over another: the linger
// looks beneath it, as it never does beneath a listener's wrapper, whose
// NetConn method, if any, may name a socket it shares or buffers, or
// itself.
type ownConn interface{ beneath() net.Conn }

func (c *recordConn) beneath() net.Conn { return c.Conn }

// recordConn counts the TLS records read through it, a unit each and one
// more for each whole KiB of one, and after the handshake charges them to
// the session's rate before each read from the network, for the one
// goroutine that reads (the session's, through crypto/tls).
type recordConn struct {
	net.Conn
	rate                   // the session's
	unit   time.Duration   // the rate's; 0 in the handshake, not paced
	readBy time.Time       // the read deadline
	done   <-chan struct{} // Shutdown's start
	units  int             // since the last take
	free   int             // units not to be charged
	header int             // bytes of the next record's header read so far
	length [2]byte
	body   int // bytes of the current record still to come

	// busy is set while the session's read is inside crypto/tls but not
	// waiting for the network (session.read), and from the handshake's
	// reads to the first frame's, when no writer can wait for it (no frame
	// but a final ERROR is decided before the join): only then may crypto/tls,
	// handling records it took in, write from inside the read (a
	// KeyUpdate's answer, an alert). Another's writer waits for its end
	// before it looks at stopped (rule 5): behind such a write that the
	// client does not read, crypto/tls would hold the frame's write back,
	// past the session's end, for up to an io-timeout, and then write it.
	bmu  sync.Mutex
	busy bool
	idle sync.Cond // on bmu: busy has ended
}

func (c *recordConn) setBusy(busy bool) {
	c.bmu.Lock()
	if c.busy = busy; !busy {
		c.idle.Broadcast()
	}
	c.bmu.Unlock()
}

// awaitIdle waits until crypto/tls can no longer be inside a write from
// the session's read: decrypting, or in a write with the waiting writer's
// deadline.
func (c *recordConn) awaitIdle() {
	c.bmu.Lock()
	for c.busy {
		c.idle.Wait()
	}
	c.bmu.Unlock()
}

// maxHandshakeUnits bounds what crypto/tls may take in during the handshake,
// which is neither paced nor charged (but for the whole KiB still to come
// of a record whose header it took in): a handshake message split a byte a
// record would be 65,536 records; an honest client sends a few, or a few
// hundred (a ClientHello cut small to pass a censor). Charging the rest
// to the session would only hurt a client that stays: a flooder redials.
const maxHandshakeUnits = 1 << 10

// maxReadAhead bounds a read from the network under crypto/tls, which
// handles all it took in before it reads again, where the records are
// paced: a buffer grown by a large ClientHello or record let one read
// take in, and have answered, 650 KeyUpdates before any charge.
const maxReadAhead = 512

var errTooManyRecords = errors.New("more than 1024 TLS records, or KiB, in the handshake")

func (c *recordConn) SetDeadline(t time.Time) error {
	c.readBy = t
	return c.Conn.SetDeadline(t)
}

func (c *recordConn) SetReadDeadline(t time.Time) error {
	c.readBy = t
	return c.Conn.SetReadDeadline(t)
}

func (c *recordConn) Read(b []byte) (int, error) {
	c.setBusy(false) // crypto/tls has handled all it took in, and waits
	// crypto/tls reads from the network only once it has handled every
	// whole record it took in, and one of its reads may read a thousand
	// records (to make up one handshake message): what it took in is paced
	// here, before it may take in more, if no read has charged it yet.
	if c.unit > 0 {
		c.pace(time.Duration(c.take())*c.unit, c.unit, c.readBy, time.Now(), c.done)
		select {
		case <-c.done: // Shutdown has ended the session, and no longer paces it
			return 0, net.ErrClosed
		default:
		}
		if !time.Now().Before(c.readBy) {
			return 0, os.ErrDeadlineExceeded
		}
	}
	n, err := c.Conn.Read(b[:min(len(b), maxReadAhead)])
	c.setBusy(true) // back in crypto/tls
	for p := b[:n]; len(p) > 0; {
		if c.body > 0 {
			k := min(c.body, len(p))
			c.body, p = c.body-k, p[k:]
			continue
		}
		if c.header >= 3 {
			c.length[c.header-3] = p[0]
		}
		if c.header, p = c.header+1, p[1:]; c.header == 5 {
			c.header, c.body = 0, int(binary.BigEndian.Uint16(c.length[:]))
			c.units += 1 + c.body>>10
		}
	}
	if c.units > maxHandshakeUnits {
		return n, errTooManyRecords
	}
	return n, err
}

// take returns the units read since the last take, less those free.
func (c *recordConn) take() (units int) {
	units, c.units = c.units-c.free, 0
	c.free = max(-units, 0)
	return max(units, 0)
}

// Why a session ended, besides the errors it sent and the I/O errors.
var (
	errExpired   = errors.New("silent for longer than its lease")
	errUnread    = errors.New("more than 65536 answers unread")
	errEnded     = errors.New("already ended")    // by Shutdown, an administrator, a failed write, a promoter
	errEndedHere = errors.New("ended in acquire") // not an end: acquire has ended the session
)

const (
	maxOwed    = 1 << 16          // answers owed while a writer is stuck
	floodPause = time.Millisecond // the flood rate's time a byte, unless the lease is short: see run
	floodSlack = 4                // bytes a read may run ahead of the rate
	maxBatch   = 1024             // bytes a write: a flood is answered in turns
)

// serve handshakes and reads the ACQUIRE, then hands over to a fresh
// goroutine: Go does not shrink the stack the deeper first frame grew
// while it waits in a read, so an idle session keeps 2 KiB, not 4.
func (s *session) serve() {
	if s.tls != nil {
		if err := s.handshake(); err != nil {
			s.end(err)
			return
		}
	}
	switch deadline, err := s.acquire(); err {
	case nil:
		go s.run(deadline)
	case errEndedHere:
	default:
		s.end(err)
	}
}

// handshake is explicit so that a client stalling it meets the io-timeout,
// and the identity is known before the first frame.
func (s *session) handshake() error {
	srv := s.srv
	deadline := time.Now().Add(srv.ioTimeout())
	s.tls.SetDeadline(deadline)
	err := s.tls.Handshake()
	srv.mu.Lock()
	failed := err != nil && s.phase < phaseEnding // not for a Shutdown's close
	if failed {
		srv.counts.TLSHandshakeErrors++
	} else if s.phase < phaseEnding {
		s.phase = phaseConnected
	}
	srv.mu.Unlock()
	if failed {
		srv.infoLimited(&srv.handshakeLog, "TLS handshake failed", "remote", s.remote, "err", err)
	}
	if err != nil {
		// Take in what the client sent after the record that failed (its
		// CertificateVerify and Finished, which may come a round trip
		// later), until it closes, 50 ms or 64 KiB, within the handshake's
		// io-timeout: left unread, it makes the close a reset, which a
		// client writing next meets instead of the alert (reads of
		// maxReadAhead leave it there).
		if m := s.meter(); m != nil && failed {
			discardInput(m.Conn, earlier(time.Now().Add(50*time.Millisecond), deadline))
		}
		return fmt.Errorf("TLS handshake: %w", err)
	}
	s.identity = Identity(s.tls.ConnectionState())
	if m := s.meter(); m != nil {
		m.units = m.body >> 10                // the rest of a record begun is charged
		m.unit, m.done = floodPause, srv.done // the lease is not known yet
	}
	return nil
}

// acquire reads the first frame, a valid ACQUIRE, and joins the table; it
// returns the end of the lease, the first read deadline of run. Its reads
// set the write deadline too: a TLS read may write (a KeyUpdate's answer).
func (s *session) acquire() (time.Time, error) {
	srv := s.srv
	s.conn.SetDeadline(time.Now().Add(srv.ioTimeout()))
	n, err := s.read(s.rbuf[:])
	if n == 0 {
		return time.Time{}, cmp.Or(err, io.EOF)
	}
	if m := s.meter(); m != nil {
		m.free++ // the record these bytes came in
	}
	s.r, s.w = 1, uint8(n)
	if typ := s.rbuf[0]; typ == TypeHeartbeat {
		return time.Time{}, ErrAcquireFirst
	} else if typ != TypeAcquire {
		return time.Time{}, unknownType(typ)
	}
	f, err := readAcquire(s)
	if err != nil {
		return time.Time{}, err
	}
	read := time.Now() // lastSeenAt
	s.name = f.Name
	if srv.Authorize != nil && (s.ending() || !srv.Authorize(s.identity, f.Name)) {
		srv.mu.Lock()
		denied := s.phase < phaseEnding // else Shutdown ended it meanwhile, with its own word
		if denied {
			srv.counts.Denials++
			srv.emitLocked(Event{Type: EventDenied}, s)
		}
		s.endOwnLocked(fmt.Errorf("%w %q", ErrNotAuthorized, f.Name))
		if denied {
			srv.infoLimited(&srv.denialLog, "ACQUIRE not authorized", "identity", s.identity, "lock", f.Name, "remote", s.remote)
		}
		srv.wg.Done()
		return time.Time{}, errEndedHere
	}
	s.lease = time.Duration(f.LeaseMS) * time.Millisecond
	beats, bad := s.scan() // decided with the ACQUIRE: the same answers however segmented
	srv.mu.Lock()
	why := srv.joinLocked(s, read) // refused (Shutdown, the lease) or joined:
	if why == nil {
		why = srv.heartbeatLocked(s, beats, read, bad)
	}
	if why != nil { // its end decided with it
		s.endOwnLocked(why)
		srv.wg.Done()
		return time.Time{}, errEndedHere
	}
	deadline := s.leaseEndLocked()
	s.drainOwnLocked()
	return deadline, nil
}

// ending: Shutdown has ended s, whose reads go on while its close lingers.
func (s *session) ending() bool {
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	return s.phase >= phaseEnding
}

// Read is io.Reader through rbuf for the rest of the ACQUIRE, which gets
// a fresh io-timeout once it needs more than the first read. Over a
// NewTLSListener's connection its records are paced as run's, a unit of
// floodPause (the lease is not known yet), within that io-timeout, but
// for the record each read's bytes came in, which it frees.
func (s *session) Read(p []byte) (int, error) {
	if s.r == s.w {
		if s.w != 0 {
			s.r, s.w = 0, 0
			s.conn.SetDeadline(time.Now().Add(s.srv.ioTimeout()))
		}
		n, err := s.read(p)
		if m := s.meter(); m != nil && n > 0 {
			m.free++
		}
		return n, err
	}
	n := copy(p, s.rbuf[s.r:s.w])
	s.r += uint8(n)
	return n, nil
}

// run reads and answers heartbeats until the session ends: len(rbuf) bytes
// at most a read, answered before the next. Reads of more than one byte,
// or any over TLS, are held to a rate of a byte each floodPause, or each
// quarter of the lease if shorter (a client may heartbeat that often);
// over a NewTLSListener's connection a read costs a unit for each byte
// past its first and for each record read from the network (and each
// whole KiB of one) since the last charge: crypto/tls reads, and answers,
// records (KeyUpdates) it never returns, many inside one Read, where
// recordConn.Read charges them to the same account before each read from
// the network. Why: docs/sessions.md, "A flood harms only the flooder".
func (s *session) run(deadline time.Time) {
	srv := s.srv
	unit := min(floodPause, s.lease/4)
	// The account goes on at the lease's unit: the ACQUIRE was paced as it
	// was read, at a millisecond. Free units left pay for what it read
	// ahead; then they are not carried.
	acct := new(rate)
	m := s.meter()
	if m != nil {
		acct, m.unit = &m.rate, unit
		m.units, m.free = max(m.units-m.free, 0), 0
	}
	for {
		var cost time.Duration // of this read, against the rate
		if s.r == s.w {
			s.conn.SetReadDeadline(deadline)
			n, err := s.read(s.rbuf[:])
			if n == 0 {
				if isTimeout(err) {
					err = errExpired
				}
				s.end(err)
				return
			}
			switch s.r, s.w = 0, uint8(n); {
			case m != nil:
				cost = time.Duration(n-1+m.take()) * unit
			case n > 1 || s.tls != nil: // a TLS read is one record, however many came
				cost = time.Duration(n) * unit
			}
		}
		beats, bad := s.scan()
		srv.mu.Lock()
		now := time.Now() // under srv.mu, the clock kick and promoteLocked judge by: a frame read in time but taken in after the lease's end is late (rule 10)
		if why := srv.heartbeatLocked(s, beats, now, bad); why != nil {
			s.endOwnLocked(why) // in the same critical section: no promotion between
			srv.wg.Done()
			return
		}
		deadline = s.leaseEndLocked()
		s.drainOwnLocked()
		acct.pace(cost, unit, deadline, now, srv.done)
	}
}

// rate is the account of a session's reads against the flood rate.
type rate struct{ due time.Time } // when the reads so far are paid for

// pace charges cost to the rate and waits while the reads are more than
// floodSlack units ahead of it, until deadline at most (a lease's end is
// seen on time) or done, Shutdown's start (it waits for this goroutine).
// A rate, not a pause after each read: a client at the protocol's pace
// never waits, whatever the server's own delays.
func (r *rate) pace(cost, unit time.Duration, deadline, now time.Time, done <-chan struct{}) {
	if cost <= 0 {
		return
	}
	r.due = later(r.due, now).Add(cost)
	if wait := min(time.Until(r.due)-floodSlack*unit, time.Until(deadline)); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-done:
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// read is the session's read from its connection. Over a NewTLSListener's
// connection it is busy from its call, when crypto/tls may first handle
// records it took in before, to its return, but while it waits for the
// network (recordConn.Read).
func (s *session) read(p []byte) (int, error) {
	m := s.meter()
	if m == nil {
		return s.conn.Read(p)
	}
	m.setBusy(true)
	defer m.setBusy(false)
	return s.conn.Read(p)
}

// scan takes the heartbeats in rbuf, then the error of a bad frame.
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

// end ends the session for a cause its own goroutine met, writes what it
// owes and retires. After a promotion it first yields, so that the push's
// writer, likely next on this processor, goes before this close.
func (s *session) end(why error) {
	s.srv.mu.Lock()
	s.endOwnLocked(why)
	s.srv.wg.Done()
}

// endOwnLocked is end with srv.mu held, which it releases, but for the
// retirement (wg.Done), which its caller does when it is done.
func (s *session) endOwnLocked(why error) {
	srv := s.srv
	if s.phase >= phaseEnding {
		why = errEnded // not what the read met after (a close, the linger's deadline)
	}
	grants := srv.counts.Grants
	srv.endLocked(s, why)
	if srv.counts.Grants != grants {
		srv.mu.Unlock()
		runtime.Gosched()
		srv.mu.Lock()
	}
	s.drainOwnLocked()
	if log := srv.log(); log.Enabled(context.Background(), slog.LevelDebug) { // no allocations per session otherwise
		log.Debug("session ended", "remote", s.remote, "lock", s.name, "why", why)
	}
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
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}

// joinLocked makes s its lock's holder or last waiter and decides the
// answer, unless Shutdown ended s or its lease passed meanwhile.
func (srv *Server) joinLocked(s *session, read time.Time) error {
	s.seen = read
	switch {
	case s.phase >= phaseEnding:
		return ErrShuttingDown
	case s.expiredLocked(time.Now()): // Authorize, or a busy server, took the lease
		return errExpired
	}
	srv.counts.Acquires++
	l := srv.locks[s.name]
	if l == nil {
		l = &lock{}
		srv.locks[s.name] = l
	}
	s.lock, s.since = l, time.Now()
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
// then bad's; it returns why s must end, or nil.
func (srv *Server) heartbeatLocked(s *session, beats int, now time.Time, bad error) error {
	switch {
	case s.phase >= phaseEnding:
		return errEnded
	case s.expiredLocked(now): // the frame came too late, as a read deadline would say
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

// owe decides n answers, WAITING or ACQUIRED by s's phase (rule 2), for
// a session its caller found alive.
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

// endLocked takes s out of the table, once, for any cause (rule 4), gives
// a holder's lock to the next live waiter unless closing, and decides the
// final ERROR when why has a code.
func (srv *Server) endLocked(s *session, why error) {
	if s.phase >= phaseEnding {
		return
	}
	if s.phase == phaseHandshake {
		why = nil // a frame now would only start another handshake
	}
	_, coded := codeOf(why)
	if !coded && s.live() && s.expiredLocked(time.Now()) {
		why = errExpired // a close, or a failed write, met past the lease (rule 10)
	}
	s.phase, s.final = phaseEnding, nil
	if coded {
		s.final = why
	} else { // an end without a word: nothing more is written
		s.dropLocked()
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

// expireLocked ends s, if it is live and its lease has passed by the
// server's clock, as expired (rule 10), wakes its writer to close it, and
// says whether it did.
func (srv *Server) expireLocked(s *session) bool {
	if !s.live() || !s.expiredLocked(time.Now()) {
		return false
	}
	srv.stopLocked(s, errExpired)
	srv.wakeLocked(s)
	return true
}

// stopLocked is another party's end of s: Shutdown, an administrator, a
// failed write, a promoter.
func (srv *Server) stopLocked(s *session, why error) {
	if s.phase < phaseEnding {
		srv.endLocked(s, why)
		s.dropLocked() // after endLocked, which decides whether an ERROR follows
	}
}

// dropLocked drops what s was owed and not yet taken, and keeps a write
// taken before from beginning (rule 5): the writer checks stopped after
// setting its deadline, and the past deadline set here fails a write that
// passed the check before its first byte. Over TLS, which keeps a write
// error for good, not when a final ERROR is to follow: there a write that
// passed its check an instant before may still begin (over a TLS listener
// other than NewTLSListener's, one that waited inside crypto/tls behind
// its own write from the read, for up to an io-timeout).
func (s *session) dropLocked() {
	s.owedWaiting, s.owedAcquired = 0, 0
	s.stopped.Store(true)
	if s.writing && (s.tls == nil || s.final == nil) {
		s.conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// promoteLocked grants l to its first waiter whose lease has not passed
// by the server's clock (rule 7), ending those before it as expired.
func (srv *Server) promoteLocked(l *lock) {
	for front := l.waiters.Front(); front != nil && l.holder == nil; front = l.waiters.Front() {
		next := front.Value.(*session)
		if !srv.expireLocked(next) { // else out of the queue
			l.waiters.Remove(front)
			next.elem = nil
			srv.grantLocked(l, next)
			srv.wakeLocked(next)
		}
	}
}

// wakeLocked gets what another party decided for s written (rule 8), by
// the writer at work, which leaves only with nothing owed, or a new one.
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

// drainOwnLocked writes on s's goroutine what it decided, unless a writer
// is at work and will. It releases srv.mu.
func (s *session) drainOwnLocked() {
	if s.writing {
		s.srv.mu.Unlock()
		return
	}
	s.writing = true
	s.drainLocked(true)
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
	case isTimeout(why):
		return ReasonIOTimeout
	}
	return ReasonGraceful
}

// drainLocked, the one writer (rule 3), takes what s is owed under srv.mu,
// writes it without, until nothing is left, then closes an ending session;
// it releases srv.mu. A write cut by a drop (rule 5) with a final ERROR
// to follow finishes its frame alone, so that the ERROR follows a whole
// stream; any other failed write may have ended inside a frame, so
// nothing more is written.
func (s *session) drainLocked(own bool) {
	srv := s.srv
	sent := false // the final ERROR, whole: the close lingers
	for {
		if !own {
			srv.expireLocked(s) // its own writes have the lease's end as their deadline
		}
		b, fin, due := s.takeLocked(own)
		if b == nil && sent && s.phase == phaseEnding {
			sent = false
			srv.mu.Unlock()
			s.linger(min(lingerTime, srv.ioTimeout())) // ending and counted meanwhile: Close cuts it
			srv.mu.Lock()
			continue
		}
		if b == nil {
			s.writing = false
			closing := s.phase == phaseEnding
			if closing {
				s.phase = phaseClosed
				delete(srv.sessions, s)
			} else if s.tls != nil && s.live() {
				// A read may write (a TLS 1.3 KeyUpdate's answer): as long as the read waits.
				s.conn.SetWriteDeadline(s.leaseEndLocked())
			}
			srv.mu.Unlock()
			if closing {
				closeConn(s.conn)
			}
			return
		}
		stopped := s.stopped.Load()
		if s.tls != nil && !own && s.live() {
			s.watchLeaseLocked()
		}
		srv.mu.Unlock()
		s.conn.SetWriteDeadline(due)
		if m := s.meter(); m != nil && !own && !stopped { // frames an end may yet drop
			m.awaitIdle() // crypto/tls's write from the read, if any, ends by due
		}
		late := s.stopped.Load() && !stopped // after the wait: when the write begins
		n, err := 0, error(nil)
		if !late {
			n, err = s.conn.Write(b)
		}
		cut := err != nil && isTimeout(err) && s.stopped.Load() && !stopped
		srv.mu.Lock()
		if s.leaseWatch != nil {
			s.leaseWatch.Stop()
			s.leaseWatch = nil
		}
		if end := frameEnd(b, n); cut && end > n && s.final != nil { // cut inside a frame, an ERROR to follow: finish it alone
			srv.mu.Unlock()
			s.conn.SetWriteDeadline(time.Now().Add(srv.ioTimeout()))
			_, err = s.conn.Write(b[n:end])
			cut = err == nil
			srv.mu.Lock()
		}
		switch code, _ := codeOf(fin); {
		case err == nil && fin != nil:
			srv.counts.Errors[code]++
			sent = true
		case cut: // the stream is whole: a final ERROR in b is owed again
			s.final = cmp.Or(s.final, fin)
		case err != nil:
			srv.stopLocked(s, err)
			s.owedWaiting, s.owedAcquired, s.final = 0, 0, nil
		}
	}
}

// lingerTime bounds the linger after a final ERROR, unless the io-timeout
// is shorter: time for a client to read it and close, and for a lost
// segment of it to be sent again.
const lingerTime = time.Second

// linger half-closes s's connection, then reads and drops what the client
// sends until it closes, for d or 64 KiB at most: closed with input
// unread, the socket would send a reset, which discards what was sent
// before it and not yet acknowledged or read (the final ERROR). It reads
// the socket beneath TLS and the meter, which two goroutines may read in
// turn (Go's poller holds one read back until the other returns): the
// session's may be in a read, ended by the deadline the linger sets, and
// may set the read deadline (its lease's end) at any time; so the linger
// sets its own before each read, and a close ends it at d whatever the
// deadline. Other connections (a net.Pipe, a listener's wrapper) are
// closed at once.
func (s *session) linger(d time.Duration) {
	c := s.conn
	if s.tls != nil {
		c = s.tls.NetConn()
	}
	for w, ok := c.(ownConn); ok; w, ok = c.(ownConn) {
		c = w.beneath()
	}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return
	}
	if c.(interface{ CloseWrite() error }).CloseWrite() != nil {
		return
	}
	t := time.AfterFunc(d, func() { c.Close() })
	defer t.Stop()
	discardInput(c, time.Now().Add(d))
}

// discardInput reads and drops what c's client sends until it closes, an
// error, 64 KiB or end, setting the read deadline before each read: another
// goroutine may set it meanwhile.
func discardInput(c net.Conn, end time.Time) {
	buf := make([]byte, 512) // not io.Discard's 8 KiB, for each of a Shutdown's sessions
	for left := 1 << 16; left > 0 && time.Now().Before(end); {
		c.SetReadDeadline(end)
		n, err := c.Read(buf[:min(left, len(buf))])
		if left -= n; err != nil && !isTimeout(err) {
			return
		}
	}
}

// watchLeaseLocked ends s at the end of its lease while another goroutine
// writes to it over TLS, where s's read may wait inside that write (TLS
// answers a KeyUpdate, or a bad record with an alert, after the write under
// way), and the read's deadline with it.
func (s *session) watchLeaseLocked() {
	s.leaseWatch = time.AfterFunc(time.Until(s.leaseEndLocked()), func() {
		srv := s.srv
		srv.mu.Lock()
		defer srv.mu.Unlock()
		switch {
		case s.leaseWatch == nil || !s.live():
		case s.expiredLocked(time.Now()):
			srv.stopLocked(s, errExpired) // and the cut fails the write
		default:
			s.leaseWatch.Reset(time.Until(s.leaseEndLocked()))
		}
	})
}

// takeLocked takes from the outbox what fits one write, in order: its
// bytes (nil for none), the final ERROR's cause if they end with it, and
// the deadline: the io-timeout, or on s's own goroutine the end of its
// lease if sooner: a client that neither reads nor sends is silent.
func (s *session) takeLocked(own bool) (b []byte, fin error, due time.Time) {
	size := int(s.owedWaiting) + 9*int(s.owedAcquired)
	if s.final != nil {
		size += 3 + MaxReasonLen
	}
	if size == 0 || s.phase == phaseClosed {
		return nil, nil, due
	}
	b = make([]byte, 0, min(size, maxBatch))
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
	if own && s.live() {
		if until := s.leaseEndLocked(); until.Before(due) {
			due = until
		}
	}
	return b, fin, due
}

// frameEnd is where the frame of b that holds byte n-1 ends; 0 for n 0.
func frameEnd(b []byte, n int) (end int) {
	for end < n {
		switch b[end] {
		case TypeAcquired:
			end += 9
		case TypeError:
			end += 3 + int(b[end+2])
		default:
			end++
		}
	}
	return end
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

// emitLocked queues ev, about s, for OnEvent (rule 9).
func (srv *Server) emitLocked(ev Event, s *session) {
	if srv.OnEvent == nil {
		return
	}
	// Once closing, every session ends in one critical section: a bound
	// would drop releases however fast OnEvent is, and they are one a
	// session, whose memory the server held a moment ago.
	if srv.untold.Load() >= maxQueuedEvents && !srv.closing.Load() {
		srv.counts.EventsDropped++
		return
	}
	ev.Time, ev.Lock, ev.Identity, ev.RemoteAddr = time.Now(), s.name, s.identity, s.remote
	srv.events = append(srv.events, ev)
	srv.untold.Add(1)
	if !srv.delivering {
		srv.delivering = true
		srv.wg.Add(1)
		go srv.deliver()
	}
}

func (srv *Server) deliver() {
	defer srv.wg.Done()
	srv.mu.Lock()
	for len(srv.events) > 0 {
		batch := srv.events
		srv.events = nil
		srv.mu.Unlock()
		for i, ev := range batch {
			batch[i] = Event{} // a told event holds no memory a stalled OnEvent keeps
			srv.OnEvent(ev)
			srv.untold.Add(-1)
		}
		srv.mu.Lock()
	}
	srv.delivering = false
	srv.mu.Unlock()
}

// Stats are the server's counters and gauges at one moment.
type Stats struct {
	Connections int // open connections, with or without a lock
	LocksHeld   int
	Waiters     int

	ConnectionsAccepted uint64
	AcceptErrors        uint64
	TLSHandshakeErrors  uint64
	Acquires            uint64            // valid, authorized ACQUIREs: granted or queued
	Denials             uint64            // ACQUIREs that Authorize refused (not those Shutdown ended meanwhile)
	Heartbeats          uint64            // HEARTBEATs a live session sent, answered unless its end dropped the answer
	Grants              uint64            // immediate or by promotion
	Releases            map[string]uint64 // of held locks, by Reason
	Errors              map[Code]uint64   // ERROR frames written whole, by code
	EventsDropped       uint64            // events that OnEvent was never told of: see OnEvent
	WaitTotal           time.Duration     // summed over Grants
	HoldTotal           time.Duration     // summed over Releases
	OldestHold          time.Time         // the grant of the longest current hold; zero: none
	OldestWait          time.Time         // the queueing of the longest current wait; zero: none
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
		if h := l.holder; h != nil {
			st.LocksHeld++
			st.OldestHold = earlier(st.OldestHold, h.since)
		}
		if head := l.waiters.Front(); head != nil { // the queue's longest wait
			st.Waiters += l.waiters.Len()
			st.OldestWait = earlier(st.OldestWait, head.Value.(*session).since)
		}
	}
	return st
}

func earlier(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
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
	Holder  *SessionInfo // never nil: a lock without a holder promotes or goes
	Waiters []SessionInfo
}

// Locks returns a snapshot of every lock with a holder or waiters, by name.
func (srv *Server) Locks() []LockInfo {
	srv.mu.Lock()
	infos := make([]LockInfo, 0, len(srv.locks))
	for name, l := range srv.locks {
		infos = append(infos, l.infoLocked(name))
	}
	srv.mu.Unlock() // the sort, a third of the time, holds nobody up
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

// ForceRelease ends the holder of name under token (0: any) at once,
// promotes the next waiter, and returns the holder; the holder is sent
// ERROR 0x02 and closed. Another token ends nobody: ErrStaleToken. A
// holder whose lease has passed is first released as expired, and the
// call answers as if its own read had seen that first: under token 0, it
// then ends the next holder, if any.
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

// KickWaiter ends the first waiter of name at remoteAddr: it leaves the
// queue at once, unpromoted, and is sent ERROR 0x02 and closed. As for
// ForceRelease, an expired holder is released first, which may promote
// that waiter (ErrNotFound), and a waiter past its lease is closed as
// expired, and then the next at remoteAddr, where connections share an
// address (a Unix socket's), is ended.
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

// kick ends the session find picks without waiting for its socket or its
// successor's (rule 8).
func (srv *Server) kick(name, event string, find func(*lock) (*session, error)) (SessionInfo, error) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var s *session
	for { // until what it finds is alive: the expired end as if their reads came first (rule 10)
		err := ErrNotFound
		if l := srv.locks[name]; l != nil && !srv.closing.Load() {
			if h := l.holder; h != nil && srv.expireLocked(h) {
				continue
			}
			s, err = find(l)
		}
		if err != nil {
			return SessionInfo{}, err
		}
		if !srv.expireLocked(s) {
			break
		}
	}
	info := s.infoLocked()
	srv.emitLocked(Event{Type: event, Token: info.Token}, s)
	srv.stopLocked(s, ErrClosedByAdmin)
	srv.wakeLocked(s)
	return info, nil
}
