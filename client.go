package monolock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Errors of the client. Each failure a caller may branch on has its own
// sentinel: a dial failure (ErrDial), a busy try (ErrBusy), a lost lock
// (ErrLockLost, together with its cause), a server code (*ServerError and
// the code's sentinel), invalid input (ErrInvalidInput); the end of the
// caller's own context is its context error.
var (
	ErrDial              = errors.New("monolock: dial failed")
	ErrBusy              = errors.New("monolock: lock is busy")
	ErrLockLost          = errors.New("monolock: lock lost")
	ErrReleased          = errors.New("monolock: lock released")
	ErrHeartbeatTimeout  = errors.New("monolock: no confirmation from the server within 0.8 of the lease")
	ErrConnectionClosed  = errors.New("monolock: connection closed")
	ErrProtocolViolation = errors.New("monolock: protocol violation")
)

// A Dialer makes the connection: a *net.Dialer, a *tls.Dialer, or
// anything else with this method.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Client.
type Config struct {
	Address string // host:port of the server
	Dialer  Dialer // nil means a zero net.Dialer
}

// Client acquires locks from one server. It keeps no state between calls
// and is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a client for cfg.
func New(cfg Config) *Client {
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{}
	}
	return &Client{cfg: cfg}
}

// Do acquires name, runs fn while the server confirms the ownership, and
// releases the lock by closing the connection when fn returns or panics
// (a panic goes on after the release). It waits in the queue for as long
// as ctx allows and makes one attempt; see DoRetry for more.
//
// fn's context is cancelled the moment ownership is no longer confirmed;
// context.Cause then tells why (it matches ErrLockLost and the concrete
// cause). fn must stop touching the guarded resource at once: the server
// may grant the lock to the next waiter when the lease runs out. Until fn
// returns, the connection stays open but silent, so that a server that can
// still hear the client does not grant the lock while fn is stopping. If
// ownership was lost while fn ran, Do returns fn's error joined with the
// cause, even when fn returned nil.
//
// Cancelling ctx while fn runs is a graceful stop: fn's context is
// cancelled with ctx's cause, but the lock stays held, and heartbeats go
// on, until fn returns; no loss is reported.
func (c *Client) Do(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, token uint64) error) error {
	l, err := c.Acquire(ctx, name, lease)
	if err != nil {
		return err
	}
	return l.run(ctx, fn)
}

// DoRetry is Do that retries what may succeed later: a dial failure, a
// connection lost or silent while queued, and server conditions (codes
// below 0x10), with exponential backoff and jitter from 100ms doubling to
// 5s, and at once after ERROR 0x01 (the server is going away; another may
// already listen). Client errors (codes from 0x10), invalid input and the
// end of ctx return at once. fn runs at most once.
func (c *Client) DoRetry(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, token uint64) error) error {
	backoff := 100 * time.Millisecond
	for again := false; ; {
		l, err := c.Acquire(ctx, name, lease)
		if err == nil {
			return l.run(ctx, fn)
		}
		var se *ServerError
		isServerErr := errors.As(err, &se)
		switch {
		case isServerErr && se.Code == CodeShuttingDown && !again:
			again = true // at once, but only once in a row: a server may say it forever
			continue
		case isServerErr && se.Temporary(), errors.Is(err, ErrDial),
			errors.Is(err, ErrConnectionClosed), errors.Is(err, ErrHeartbeatTimeout):
		default:
			return err
		}
		again = false
		delay := backoff/2 + rand.N(backoff/2+1) // jitter keeps a crowd from retrying in step
		backoff = min(2*backoff, 5*time.Second)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctxErr(ctx)
		}
	}
}

// run runs fn under l for Do.
func (l *Lock) run(ctx context.Context, fn func(ctx context.Context, token uint64) error) (err error) {
	fnCtx, cancel := context.WithCancelCause(l.ctx)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer func() {
		stop()
		if lost := l.Release(); lost != nil {
			err = errors.Join(err, lost)
		}
		cancel(nil)
	}()
	return fn(fnCtx, l.token)
}

// Acquire waits in name's queue for as long as ctx allows and returns the
// held lock. The lock is held, with heartbeats, until Release or until the
// server stops confirming it; ctx no longer matters once Acquire returned.
// After a loss, call Release once the guarded work has stopped: until then,
// or for at most one more lease, the connection stays open without
// heartbeats, so the server grants the lock to nobody else earlier than its
// lease allows.
func (c *Client) Acquire(ctx context.Context, name string, lease time.Duration) (*Lock, error) {
	return c.acquire(ctx, name, lease, false)
}

// TryAcquire is Acquire that does not wait: if the lock is held, it closes
// the connection and returns ErrBusy.
func (c *Client) TryAcquire(ctx context.Context, name string, lease time.Duration) (*Lock, error) {
	return c.acquire(ctx, name, lease, true)
}

func (c *Client) acquire(ctx context.Context, name string, lease time.Duration, try bool) (*Lock, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateLease(lease); err != nil {
		return nil, err
	}
	conn, err := c.cfg.Dialer.DialContext(ctx, "tcp", c.cfg.Address)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxErr(ctx)
		}
		return nil, &dialError{err}
	}
	l := &Lock{
		name:    name,
		lease:   lease,
		conn:    conn,
		try:     try,
		granted: make(chan struct{}),
		release: make(chan struct{}),
		done:    make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	go l.heartbeat()
	select {
	case <-l.granted:
		return l, nil
	case <-l.done:
		return nil, l.err
	case <-ctx.Done():
		l.Release()
		return nil, ctxErr(ctx)
	}
}

// Lock is a held lock. Its connection is read and heartbeated by a
// goroutine of its own until Release or the loss of the lock.
type Lock struct {
	name  string
	lease time.Duration
	conn  net.Conn
	try   bool

	token   uint64        // written before granted is closed
	granted chan struct{} // closed on the grant
	release chan struct{} // closed by Release
	once    sync.Once
	done    chan struct{} // closed when the heartbeat goroutine has ended
	err     error         // why it ended; nil after a plain Release; read after done

	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Token returns the fencing token of the grant. Hand it to the guarded
// resource, which should refuse a token lower than one it has seen.
func (l *Lock) Token() uint64 { return l.token }

// Context returns a context cancelled the moment ownership is no longer
// confirmed, or at Release; context.Cause tells which.
func (l *Lock) Context() context.Context { return l.ctx }

// Done is closed the moment ownership is no longer confirmed, or at Release.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held. After a loss it returns the
// cause, which matches ErrLockLost and the concrete reason
// (ErrHeartbeatTimeout, ErrConnectionClosed, ErrProtocolViolation, or a
// *ServerError); after Release, ErrReleased.
func (l *Lock) Err() error { return context.Cause(l.ctx) }

// Release gives the lock up by closing the connection. It returns the
// cause if the lock had already been lost, and nil otherwise. It is safe
// to call more than once, from any goroutine.
func (l *Lock) Release() error {
	l.once.Do(func() { close(l.release) })
	<-l.done
	return l.err
}

type state int

const (
	connecting state = iota // ACQUIRE sent, no answer yet
	queued                  // WAITING received
	holding                 // ACQUIRED received
)

type received struct {
	f   Frame
	err error
	at  time.Time
}

// heartbeat is the lock's goroutine. It alone writes to the connection
// and decides the state; a reader goroutine hands it whole frames.
//
// The rules are the specification's: a claim is confirmed by the answer to
// a request (ACQUIRE or HEARTBEAT) and, once confirmed, counts from that
// request's send time; it is abandoned at 0.8 of the lease after the send
// of the last confirmed request, before the server, counting the full lease
// from a later arrival, can drop it. One request is in flight at a time, so
// answers pair with requests without ids. The promotion push moves a
// queued claim to held and confirms nothing.
func (l *Lock) heartbeat() {
	frames := make(chan received)
	go l.read(frames)

	timeout := l.lease / 5 * 4
	var (
		st        = connecting
		inflight  bool
		lastSend  time.Time // of the request in flight, or of the last one
		confirmed time.Time // send time of the last confirmed request
		srtt      time.Duration
	)
	send := func(f Frame) error {
		b, _ := f.AppendBinary(nil)
		lastSend = time.Now()
		inflight = true
		l.conn.SetWriteDeadline(confirmed.Add(timeout))
		_, err := l.conn.Write(b)
		return err
	}
	confirm := func(at time.Time) {
		inflight = false
		confirmed = lastSend
		if rtt := at.Sub(lastSend); srtt == 0 {
			srtt = rtt
		} else {
			srtt += (rtt - srtt) / 5 // EWMA, alpha 0.2
		}
	}
	grant := func(token uint64) {
		st = holding
		l.token = token
		close(l.granted)
	}
	readerDone := false
	end := func(cause error) {
		lost := cause != nil && st == holding
		if lost {
			cause = &lostError{cause}
		}
		l.err = cause
		if cause == nil {
			cause = ErrReleased
		}
		l.cancel(cause)
		if lost && !readerDone {
			// Closing now would let the server grant the lock again at once,
			// while the work that was just cancelled is still stopping. A
			// silent session keeps it until Release, or until the server drops
			// it a lease after the last heartbeat it read.
			linger(l, frames)
		}
		l.conn.Close()
		close(l.done)
	}

	confirmed = time.Now() // the ACQUIRE's send: its answer is due within the timeout
	if err := send(Frame{Type: TypeAcquire, LeaseMS: uint32(l.lease / time.Millisecond), Name: l.name}); err != nil {
		end(writeErr(err))
		return
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		now := time.Now()
		deadline := confirmed.Add(timeout)
		if !now.Before(deadline) {
			end(ErrHeartbeatTimeout)
			return
		}
		wake := deadline
		if !inflight {
			next := lastSend.Add(heartbeatInterval(l.lease, srtt))
			if !next.After(now) {
				if err := send(Frame{Type: TypeHeartbeat}); err != nil {
					end(writeErr(err))
					return
				}
				continue
			}
			if next.Before(wake) {
				wake = next
			}
		}
		timer.Reset(wake.Sub(now))
		select {
		case <-l.release:
			end(nil)
			return
		case <-timer.C:
		case r := <-frames:
			if r.err != nil {
				readerDone = true
				end(r.err)
				return
			}
			switch f := r.f; {
			case f.Type == TypeError:
				end(&ServerError{Code: f.Code, Reason: strings.ToValidUTF8(f.Reason, string(utf8.RuneError))})
				return
			case f.Type == TypeAcquired && st == queued:
				grant(f.Token) // the push: a request in flight stays in flight
			case !inflight:
				end(violation("unsolicited frame 0x%02x", f.Type))
				return
			case f.Type == TypeWaiting && st == holding:
				end(violation("WAITING after ACQUIRED"))
				return
			case f.Type == TypeAcquired && st == holding && f.Token != l.token:
				end(violation("token %d after %d", f.Token, l.token))
				return
			case f.Type == TypeWaiting:
				confirm(r.at)
				if st == connecting {
					st = queued
					if l.try {
						end(ErrBusy)
						return
					}
				}
			case f.Type == TypeAcquired:
				confirm(r.at)
				if st == connecting {
					grant(f.Token)
				}
			default:
				end(violation("client frame 0x%02x from the server", f.Type))
				return
			}
		}
	}
}

// linger waits, sending nothing, for Release, the server's close, or a
// lease, by which time the server has dropped the session unless a late
// heartbeat reached it.
func linger(l *Lock, frames <-chan received) {
	t := time.NewTimer(l.lease)
	defer t.Stop()
	for {
		select {
		case <-l.release:
			return
		case <-t.C:
			return
		case r := <-frames:
			if r.err != nil {
				return
			}
		}
	}
}

// read is the permanent reader: it hands every frame to the heartbeat
// goroutine until the connection fails or the lock has ended.
func (l *Lock) read(frames chan<- received) {
	r := bufio.NewReaderSize(l.conn, 64)
	for {
		var rec received
		switch typ, err := r.Peek(1); {
		case err != nil:
			rec.err = readErr(err)
		case typ[0] != TypeWaiting && typ[0] != TypeAcquired && typ[0] != TypeError:
			// Decided on the type byte alone: a client frame's body would be
			// read as one and could wait for bytes that never come.
			rec.err = violation("type byte 0x%02x from the server", typ[0])
		default:
			rec.f, err = ReadFrame(r)
			rec.err = readErr(err)
		}
		rec.at = time.Now()
		select {
		case frames <- rec:
		case <-l.done:
			return
		}
		if rec.err != nil {
			return
		}
	}
}

// heartbeatInterval is the specification's schedule: a quarter of the
// lease, shortened by twice the smoothed round trip, never below 100ms or
// a quarter of the lease, whichever is less.
func heartbeatInterval(lease, srtt time.Duration) time.Duration {
	base := lease / 4
	floor := min(100*time.Millisecond, base)
	return max(floor, base-2*srtt)
}

func readErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w by the server (%w)", ErrConnectionClosed, err)
	}
	return fmt.Errorf("%w: %w", ErrConnectionClosed, err)
}

func writeErr(err error) error {
	if isTimeout(err) { // the write deadline is the claim's
		return ErrHeartbeatTimeout
	}
	return fmt.Errorf("%w: %w", ErrConnectionClosed, err)
}

func violation(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocolViolation}, args...)...)
}

// ctxErr is ctx's error, with its cause when the cause says more.
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// dialError keeps the dialer's error as it is and adds ErrDial.
type dialError struct{ err error }

func (e *dialError) Error() string        { return e.err.Error() }
func (e *dialError) Unwrap() error        { return e.err }
func (e *dialError) Is(target error) bool { return target == ErrDial }

// lostError is the end of a held lock: ErrLockLost and its cause.
type lostError struct{ cause error }

func (e *lostError) Error() string {
	return "monolock: lock lost: " + strings.TrimPrefix(e.cause.Error(), "monolock: ")
}
func (e *lostError) Unwrap() error        { return e.cause }
func (e *lostError) Is(target error) bool { return target == ErrLockLost }
