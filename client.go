package monolock

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Errors of the client. A lost lock matches ErrLockLost and its cause, and
// a server code *ServerError and the code's sentinel.
var (
	ErrDial              = errors.New("monolock: dial failed")
	ErrBusy              = errors.New("monolock: lock is busy")
	ErrLockLost          = errors.New("monolock: lock lost")
	ErrReleased          = errors.New("monolock: lock released")
	ErrHeartbeatTimeout  = errors.New("monolock: no confirmation from the server within 0.8 of the lease")
	ErrConnectionClosed  = errors.New("monolock: connection closed")
	ErrProtocolViolation = errors.New("monolock: protocol violation")
)

// A Dialer makes the connection: a *net.Dialer, a *tls.Dialer, or another.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Client.
type Config struct {
	Address string // host:port of the server
	Dialer  Dialer // nil means a zero net.Dialer

	// OnRetry, if set, is told by AcquireRetry and DoRetry why each attempt
	// (from 1) failed and how long it waits: a wrong address is retried,
	// silently without it.
	OnRetry func(attempt int, err error, wait time.Duration)
}

// Client acquires locks from one server; it is safe for concurrent use.
type Client struct{ cfg Config }

// New returns a client for cfg.
func New(cfg Config) *Client {
	cfg.Dialer = cmp.Or(cfg.Dialer, Dialer(&net.Dialer{}))
	return &Client{cfg: cfg}
}

// Do acquires name (one attempt), runs fn, and releases when fn returns or
// panics. fn's context is cancelled, with a cause matching ErrLockLost, the moment
// ownership is no longer confirmed: fn must stop touching the resource at
// once. Do then returns fn's error joined with the cause, even a nil one.
// Cancelling ctx while fn runs is a graceful stop, not a loss: fn's
// context is cancelled, but the lock stays held until fn returns.
func (c *Client) Do(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, token uint64) error) error {
	l, err := c.Acquire(ctx, name, lease)
	if err != nil {
		return err
	}
	return l.run(ctx, fn)
}

// DoRetry is Do through AcquireRetry: fn runs at most once.
func (c *Client) DoRetry(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, token uint64) error) error {
	l, err := c.AcquireRetry(ctx, name, lease)
	if err != nil {
		return err
	}
	return l.run(ctx, fn)
}

// AcquireRetry is Acquire that retries a failed dial, a connection closed
// or silent before the grant (a balancer without a backend closes before
// any reply) and codes below 0x10: at once after 0x01 (another server may
// listen), else after [base, 1.5×base), base 100ms doubling to 5s (the
// jitter keeps clients out of step). Invalid input, codes from 0x10, a
// protocol violation, an address that is not host:port, a server
// certificate that does not verify (by the chain, or by the Dialer's own
// VerifyConnection or VerifyPeerCertificate of a *tls.Dialer), a TLS
// alert from the server and the end of ctx return at once.
func (c *Client) AcquireRetry(ctx context.Context, name string, lease time.Duration) (*Lock, error) {
	backoff := 100 * time.Millisecond
	for attempt, again := 1, false; ; attempt++ {
		l, err := c.Acquire(ctx, name, lease)
		if err == nil {
			return l, nil
		}
		var se *ServerError
		wait := backoff + rand.N(backoff/2)
		var alert *net.OpError // a TLS alert from the server: it refused our certificate
		switch isServerErr := errors.As(err, &se); {
		case ctx.Err() != nil:
			return nil, ctxErr(ctx)
		case errors.As(err, new(*tls.CertificateVerificationError)), errors.As(err, &alert) && alert.Op == "remote error",
			errors.As(err, new(*net.AddrError)): // an address without a port, say
			return nil, err
		case isServerErr && se.Code == CodeShuttingDown && !again:
			wait = 0 // at once, but only once in a row: a server may say it forever
		case isServerErr && se.Temporary(), errors.Is(err, ErrDial), errors.Is(err, ErrHeartbeatTimeout), errors.Is(err, ErrConnectionClosed):
			backoff = min(2*backoff, 5*time.Second)
		default:
			return nil, err
		}
		again = wait == 0
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(attempt, err, wait)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctxErr(ctx)
		}
	}
}

func (l *Lock) run(ctx context.Context, fn func(ctx context.Context, token uint64) error) (err error) {
	// The lock's context is fn's alone: a graceful stop may cancel it
	// without touching the claim, which never looks at it.
	stop := context.AfterFunc(ctx, func() { l.cancel(context.Cause(ctx)) })
	defer func() {
		stop()
		if lost := l.Release(); lost != nil && !errors.Is(err, lost) { // fn may return the cause
			err = errors.Join(err, lost)
		}
	}()
	return fn(l.ctx, l.token)
}

// Acquire waits in name's queue as long as ctx allows and returns the lock,
// held until Release or a loss. After a loss, call Release once the work
// has stopped: until then, a lease at most, the lock goes to no one else.
func (c *Client) Acquire(ctx context.Context, name string, lease time.Duration) (*Lock, error) {
	return c.acquire(ctx, name, lease, false)
}

// TryAcquire is Acquire that does not queue: it returns ErrBusy instead.
func (c *Client) TryAcquire(ctx context.Context, name string, lease time.Duration) (*Lock, error) {
	return c.acquire(ctx, name, lease, true)
}

// acquire runs the claim in the caller's goroutine until the grant.
func (c *Client) acquire(ctx context.Context, name string, lease time.Duration, try bool) (*Lock, error) {
	if err := cmp.Or(ValidateName(name), ValidateLease(lease)); err != nil {
		return nil, err
	}
	conn, err := finalRefusals(c.cfg.Dialer).DialContext(ctx, "tcp", c.cfg.Address)
	var oe *net.OpError
	switch { // a dial error is the dialer's as it is, with ErrDial
	case err != nil && ended(ctx):
		return nil, ctxErr(ctx)
	case errors.As(err, &oe) && oe.Addr != nil: // it names the address (a TLS alert's does not)
		return nil, &wrapError{"monolock: ", []error{ErrDial, err}}
	case err != nil:
		return nil, &wrapError{"monolock: dial " + c.cfg.Address + ": ", []error{ErrDial, err}}
	}
	l := &Lock{name: name, lease: lease, conn: conn, r: bufio.NewReaderSize(conn, 64), try: try,
		done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { l.Release() }) // ends any read or write of the claim at once
	switch held, stopped := l.claim(true), stop(); {
	case held && stopped:
		go l.claim(false)
		return l, nil
	case held: // no goroutine of its own yet
		l.Release()
		close(l.done)
	case stopped && !ended(ctx):
		return nil, l.err
	}
	return nil, ctxErr(ctx)
}

// finalRefusals marks as a *tls.CertificateVerificationError a refusal by
// a *tls.Dialer's own VerifyConnection or VerifyPeerCertificate: a
// certificate refused is refused again on every retry. The Config is
// cloned at each dial, so that later changes to it still count.
func finalRefusals(d Dialer) Dialer {
	td, ok := d.(*tls.Dialer)
	if !ok || td.Config == nil || td.Config.VerifyConnection == nil && td.Config.VerifyPeerCertificate == nil {
		return d
	}
	final := func(err error, certs []*x509.Certificate) error {
		if err == nil || errors.As(err, new(*tls.CertificateVerificationError)) {
			return err
		}
		return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
	}
	cfg := td.Config.Clone()
	if verify := cfg.VerifyConnection; verify != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { return final(verify(cs), cs.PeerCertificates) }
	}
	if verify := cfg.VerifyPeerCertificate; verify != nil {
		cfg.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
			err := verify(raw, chains)
			if err == nil {
				return nil
			}
			var certs []*x509.Certificate
			for _, der := range raw {
				if c, perr := x509.ParseCertificate(der); perr == nil {
					certs = append(certs, c)
				}
			}
			return final(err, certs)
		}
	}
	return &tls.Dialer{NetDialer: td.NetDialer, Config: cfg}
}

// ended reports whether ctx has ended, waiting at its deadline (a second
// at most) for the end a moment later: a dialer may return its own error
// in between.
func ended(ctx context.Context) bool {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return ctx.Err() != nil
}

// Lock is a held lock, heartbeated by its goroutine until Release or a loss.
type Lock struct {
	name  string
	lease time.Duration
	conn  net.Conn
	r     *bufio.Reader
	try   bool
	token uint64

	mu    sync.Mutex
	ended bool          // guarded by mu: by Release, or by a loss; err is final
	err   error         // guarded by mu: the loss, or nil
	done  chan struct{} // closed when the claim's goroutine has ended

	ctx    context.Context
	cancel context.CancelCauseFunc

	// The claim, owned by the goroutine that runs claim.
	st        int
	inflight  bool          // a request awaits its answer
	lastSend  time.Time     // of the request in flight, or of the last one
	confirmed time.Time     // send time of the last confirmed request
	srtt      time.Duration // smoothed round trip
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Token returns the grant's fencing token, for the guarded resource.
func (l *Lock) Token() uint64 { return l.token }

// Context is cancelled when ownership is no longer confirmed, or at Release.
func (l *Lock) Context() context.Context { return l.ctx }

// Done is closed the moment ownership is no longer confirmed, or at Release.
func (l *Lock) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held, the cause of a loss (ErrLockLost
// and its cause), or ErrReleased.
func (l *Lock) Err() error { return context.Cause(l.ctx) }

// Release closes the connection and returns the cause of a loss before it,
// or nil. It may be called again, from any goroutine, and waits for nothing.
func (l *Lock) Release() error {
	l.mu.Lock()
	l.ended = true
	l.cancel(ErrReleased) // unless a loss or a graceful stop gave the cause
	err := l.err
	l.mu.Unlock()
	l.conn.Close()
	return err
}

const (
	connecting = iota // ACQUIRE sent, no answer yet
	queued            // WAITING received
	holding           // ACQUIRED received
)

// claim sends the ACQUIRE (untilGrant) and heartbeats, and judges the
// answers. With untilGrant it returns true at the grant; otherwise, and on
// any end before it, it ends the lock and returns false. The claim is
// abandoned 0.8 of the lease after the last confirmed send, before the
// server, counting a full lease from a later arrival, can drop it. One
// request is in flight at a time, so answers pair with requests.
func (l *Lock) claim(untilGrant bool) bool {
	timeout := l.lease / 5 * 4
	var err error
	if untilGrant {
		l.confirmed = time.Now() // the ACQUIRE's answer is due within the timeout
		b, _ := Frame{Type: TypeAcquire, LeaseMS: uint32(l.lease / time.Millisecond), Name: l.name}.AppendBinary(nil)
		err = l.send(b, l.confirmed.Add(timeout))
	}
	for err == nil && !(untilGrant && l.st == holding) {
		deadline := l.confirmed.Add(timeout)
		wake := deadline
		if next := l.lastSend.Add(heartbeatInterval(l.lease, l.srtt)); !l.inflight && next.Before(wake) {
			wake = next
		}
		l.conn.SetReadDeadline(wake)
		f, rerr := l.read(deadline)
		now := time.Now()
		switch {
		case !now.Before(deadline):
			err = ErrHeartbeatTimeout // whatever was read: it arrived too late to confirm
		case rerr == nil:
			err = l.judge(f, now)
		case rerr != ErrHeartbeatTimeout:
			err = rerr
		case !l.inflight && !now.Before(wake):
			err = l.send([]byte{TypeHeartbeat}, deadline)
		}
	}
	if err != nil {
		l.end(err)
	}
	return err == nil
}

func (l *Lock) send(b []byte, deadline time.Time) error {
	l.lastSend, l.inflight = time.Now(), true
	l.conn.SetDeadline(deadline) // a lazy TLS handshake in Write reads too
	_, err := l.conn.Write(b)
	return l.ioErr(err)
}

// read reads a frame: its first byte by the deadline set, the rest by deadline.
func (l *Lock) read(deadline time.Time) (Frame, error) {
	typ, err := l.r.Peek(1)
	switch {
	case err == nil && typ[0] != TypeWaiting && typ[0] != TypeAcquired && typ[0] != TypeError:
		// Decided on the type byte alone: a client frame's body would be
		// read as one and could wait for bytes that never come.
		return Frame{}, violation("type byte 0x%02x from the server", typ[0])
	case err == nil && typ[0] != TypeError && !l.inflight && l.st != queued:
		return Frame{}, violation("unsolicited frame 0x%02x", typ[0]) // likewise

	case err == nil:
		l.conn.SetReadDeadline(deadline)
		f, err := ReadFrame(l.r)
		return f, l.ioErr(err)
	}
	return Frame{}, l.ioErr(err)
}

// ioErr is a read or write error as the claim sees it: a timeout (the
// deadlines are the claim's), or the connection closed, and its cause.
func (l *Lock) ioErr(err error) error {
	switch {
	case err == nil:
		return nil
	case os.IsTimeout(err):
		return ErrHeartbeatTimeout
	}
	by := ""
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		by = " by the server"
	}
	if l.st == connecting { // a TLS mismatch, or a balancer without a backend
		by += " before any reply"
	}
	return &wrapError{"monolock: connection closed" + by + ": ", []error{ErrConnectionClosed, err}}
}

// judge acts on a frame read at at.
func (l *Lock) judge(f Frame, at time.Time) error {
	switch {
	case f.Type == TypeAcquired && f.Token == 0:
		return violation("token 0") // fencing takes 0 for no token
	case f.Type == TypeError:
		return &ServerError{Code: f.Code, Reason: strings.ToValidUTF8(f.Reason, "\uFFFD")}
	case f.Type == TypeAcquired && l.st == queued:
		l.st, l.token = holding, f.Token // the push: a request in flight stays in flight
		return nil
	case !l.inflight:
		return violation("unsolicited frame 0x%02x", f.Type)
	case f.Type == TypeWaiting && l.st == holding:
		return violation("WAITING after ACQUIRED")
	case f.Type == TypeAcquired && l.st == holding && f.Token != l.token:
		return violation("token %d after %d", f.Token, l.token)
	}
	// The answer to the request in flight.
	l.inflight, l.confirmed = false, l.lastSend
	rtt := at.Sub(l.lastSend)
	l.srtt = cmp.Or(l.srtt, rtt) // the first round trip starts the EWMA, alpha 0.2
	l.srtt += (rtt - l.srtt) / 5
	switch {
	case l.st != connecting:
	case f.Type == TypeAcquired:
		l.st, l.token = holding, f.Token
	case l.try:
		return ErrBusy
	default:
		l.st = queued
	}
	return nil
}

// end ends the claim with cause, unless Release came first. After a held
// lock's loss the connection stays open but silent until Release, the
// server's close or a lease: closing now would let the server grant the
// lock while the cancelled work is still stopping.
func (l *Lock) end(cause error) {
	if l.st == holding {
		cause = &wrapError{"monolock: lock lost: ", []error{ErrLockLost, cause}}
	}
	l.mu.Lock()
	lost := !l.ended && l.st == holding
	if !l.ended {
		l.ended, l.err = true, cause
		l.cancel(cause)
	}
	l.mu.Unlock()
	if lost {
		l.conn.SetReadDeadline(time.Now().Add(l.lease))
		io.Copy(io.Discard, l.r)
	}
	l.conn.Close()
	close(l.done)
}

// heartbeatInterval is the specification's.
func heartbeatInterval(lease, srtt time.Duration) time.Duration {
	return max(min(100*time.Millisecond, lease/4), lease/4-2*srtt)
}

func violation(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocolViolation}, args...)...)
}

// ctxErr is ctx's error, with its cause when the cause says more.
func ctxErr(ctx context.Context) error {
	if err, cause := ctx.Err(), context.Cause(ctx); cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return ctx.Err()
}

// wrapError matches a sentinel and a cause, errs. Its text, made only when
// read (a claim that Release ended makes one in vain), says the cause once.
type wrapError struct {
	prefix string
	errs   []error
}

func (e *wrapError) Error() string {
	return e.prefix + strings.TrimPrefix(e.errs[1].Error(), "monolock: ")
}
func (e *wrapError) Unwrap() []error { return e.errs }
