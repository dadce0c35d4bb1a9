package monolock

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

func TestDoRunsFnWithTheTokenAndReleases(t *testing.T) {
	addr := startServer(t, &Server{})
	c := New(Config{Address: addr})
	var got uint64
	w := dialRaw(t, addr)
	err := c.Do(context.Background(), "job", time.Second, func(ctx context.Context, token uint64) error {
		got = token
		// While fn runs the lock is held: a raw client queues behind it.
		w.send(acquire("job", time.Minute))
		w.expectWaiting()
		return nil
	})
	if err != nil || got == 0 {
		t.Fatalf("Do = %v, token %d", err, got)
	}
	// Released: the waiter is granted a larger token.
	if next := w.expectAcquired(); next <= got {
		t.Fatalf("token %d after %d", next, got)
	}
}

func TestDoReturnsFnError(t *testing.T) {
	addr := startServer(t, &Server{})
	c := New(Config{Address: addr})
	boom := errors.New("boom")
	err := c.Do(context.Background(), "e", time.Second, func(context.Context, uint64) error { return boom })
	if err != boom {
		t.Fatalf("Do = %v, want fn's error unchanged", err)
	}
}

// A lock held for many leases stays held: heartbeats keep it alive.
func TestLockHeldForManyLeases(t *testing.T) {
	addr := startServer(t, &Server{})
	c := New(Config{Address: addr})
	const lease = 400 * time.Millisecond
	err := c.Do(context.Background(), "long", lease, func(ctx context.Context, token uint64) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(8 * lease):
			return nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The central promise: in every fault, the holder's context is cancelled
// before the server lets anyone else have the lock, early enough for work
// that takes a moment to stop to have stopped.
func TestHolderStopsBeforeTheServerReleases(t *testing.T) {
	const (
		lease    = 3 * time.Second
		stopping = lease / 30 // fn's time from the cancellation to its return
	)
	for _, tc := range []struct {
		name  string
		fault func(*faultProxy, *Server)
	}{
		{"blackhole both ways", func(p *faultProxy, _ *Server) {
			p.set(up, fault{drop: true})
			p.set(down, fault{drop: true})
		}},
		{"heartbeats lost", func(p *faultProxy, _ *Server) { p.set(up, fault{drop: true}) }},
		{"replies lost", func(p *faultProxy, _ *Server) { p.set(down, fault{drop: true}) }},
		{"replies delayed", func(p *faultProxy, _ *Server) { p.set(down, fault{delay: lease * 6 / 10}) }},
		// Late replies, then a lost heartbeat: a client that counted from a
		// reply's arrival instead of its request's send would hold on past
		// the server's expiry here.
		{"replies delayed, then heartbeats lost", func(p *faultProxy, _ *Server) {
			p.set(down, fault{delay: lease * 3 / 10})
			time.Sleep(lease)
			p.set(up, fault{drop: true})
		}},
		{"server killed", func(_ *faultProxy, srv *Server) { srv.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := &Server{}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			go srv.Serve(l)
			defer srv.Close()
			p := startProxy(t, addr)
			c := New(Config{Address: p.addr})

			var stoppedAt, grantedAt atomic.Int64 // ns since start
			start := time.Now()
			held := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- c.Do(context.Background(), "fenced", lease, func(ctx context.Context, token uint64) error {
					close(held)
					select {
					case <-ctx.Done():
					case <-time.After(wait):
						t.Errorf("fn's context not cancelled %v after the grant", wait)
					}
					time.Sleep(stopping)
					stoppedAt.Store(int64(time.Since(start)))
					return nil
				})
			}()
			clientWait(t, held, wait, "fn to start")
			time.Sleep(lease / 2) // a few heartbeats in
			if tc.name == "server killed" {
				// The next holder comes from a new server on the same address,
				// started later, as a restarted process would be.
				tc.fault(p, srv)
				time.Sleep(lease / 4)
				srv2 := &Server{}
				var l2 net.Listener
				waitFor(t, "the address to be free", func() bool {
					l2, err = net.Listen("tcp", addr)
					return err == nil
				})
				go srv2.Serve(l2)
				defer srv2.Close()
			} else {
				tc.fault(p, srv)
			}
			waiter := dialRaw(t, addr) // directly to the server, past the faults
			waiter.send(acquire("fenced", time.Minute))
			if f, err := waiter.read(wait); err == nil && f.Type == TypeWaiting {
				_, err = waiter.read(wait)
				if err != nil {
					t.Fatalf("waiter: %v", err)
				}
			}
			grantedAt.Store(int64(time.Since(start)))

			err = clientWait(t, done, 2*wait, "Do to return")
			if !errors.Is(err, ErrLockLost) {
				t.Fatalf("Do returned %v, want ErrLockLost", err)
			}
			sa, ga := time.Duration(stoppedAt.Load()), time.Duration(grantedAt.Load())
			if sa == 0 || sa >= ga {
				t.Fatalf("holder stopped at %v, next holder granted at %v: the holder must stop first (%v)", sa, ga, err)
			}
			t.Logf("holder stopped at %v, next holder granted at %v; cause: %v", sa, ga, err)
		})
	}
}

// A connection cut in the middle reaches both ends at once, so the server
// may grant the lock again as the holder hears of it (the fencing token
// orders the two); the holder must hear at once, not at its timeout.
func TestCutConnectionCancelsAtOnce(t *testing.T) {
	addr := startServer(t, &Server{})
	p := startProxy(t, addr)
	const lease = time.Minute
	start := time.Now()
	err := New(Config{Address: p.addr}).Do(context.Background(), "cut", lease, func(ctx context.Context, token uint64) error {
		p.cut()
		clientWait(t, ctx.Done(), wait, "fn's context to be cancelled by the cut")
		return nil
	})
	if !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrConnectionClosed) {
		t.Fatalf("Do = %v, want a lost lock with a closed connection", err)
	}
	if d := time.Since(start); d > lease/4 {
		t.Fatalf("cut noticed after %v", d)
	}
}

// Section 7's scenario: a queued client's heartbeat is lost, then the
// promotion push arrives. The push confirms nothing, so the client's
// deadline still counts from its ACQUIRE, and it gives up before the
// server, which never saw the heartbeat, drops it and grants the next.
func TestPushAfterLostHeartbeatConfirmsNothing(t *testing.T) {
	const lease = 2 * time.Second
	srv := &Server{}
	addr := startServer(t, srv)
	p := startProxy(t, addr)
	holder := dialRaw(t, addr)
	holder.send(acquire("push", time.Minute))
	holder.expectAcquired()

	// Acquire through a dialer that lets the ACQUIRE through and then drops
	// everything the client sends: its first heartbeat never arrives.
	c := New(Config{Address: p.addr, Dialer: dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, address)
		return &afterFirstWrite{Conn: conn, then: func() { p.set(up, fault{drop: true}) }}, err
	})})
	start := time.Now()
	acquired := make(chan *Lock, 1)
	go func() {
		l, err := c.Acquire(context.Background(), "push", lease)
		if err != nil {
			t.Error(err)
		}
		acquired <- l
	}()
	waitFor(t, "the client's first heartbeat to be sent and lost", func() bool {
		return time.Since(start) > lease/4+lease/10
	})
	holder.Close() // the server pushes ACQUIRED to the client
	l := clientWait(t, acquired, wait, "the grant")
	if l == nil {
		return
	}
	defer l.Release()
	next := dialRaw(t, addr)
	next.send(acquire("push", time.Minute))
	if f, err := next.read(wait); err != nil || f.Type != TypeWaiting {
		t.Fatalf("next: %+v, %v", f, err)
	}
	clientWait(t, l.Done(), wait, "the loss of the pushed claim")
	cancelled := time.Since(start)
	if _, err := next.read(wait); err != nil {
		t.Fatalf("next waiter: %v", err)
	}
	granted := time.Since(start)
	if cancelled >= granted {
		t.Fatalf("client believed until %v, but the server granted the lock again at %v", cancelled, granted)
	}
	if cancelled > lease*8/10+lease/10 {
		t.Fatalf("client believed until %v: the push extended its claim past 0.8 of the lease from the ACQUIRE", cancelled)
	}
	if !errors.Is(l.Err(), ErrHeartbeatTimeout) || !errors.Is(l.Err(), ErrLockLost) {
		t.Fatalf("cause %v, want a heartbeat timeout", l.Err())
	}
}

type afterFirstWrite struct {
	net.Conn
	once sync.Once
	then func()
}

func (c *afterFirstWrite) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.once.Do(func() {
		time.Sleep(50 * time.Millisecond) // let the ACQUIRE pass the proxy first
		c.then()
	})
	return n, err
}

// fakeServer accepts connections and hands each to serve.
func fakeServer(t *testing.T, serve func(c net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return l.Addr().String()
}

func writeFrame(c net.Conn, f Frame) error {
	b, err := f.AppendBinary(nil)
	if err != nil {
		return err
	}
	_, err = c.Write(b)
	return err
}

// A server that answers slowly: never more than one heartbeat in flight,
// and the interval between sends shrinks with the round trip.
func TestHeartbeatScheduleAndOneInFlight(t *testing.T) {
	const lease = 2 * time.Second // a quarter is 500ms
	for _, tc := range []struct {
		name             string
		replyDelay       time.Duration
		minMean, maxMean time.Duration
	}{
		// Fast replies: the interval is the full quarter.
		{"fast", 0, 440 * time.Millisecond, 520 * time.Millisecond},
		// 150ms replies: the interval falls from 500ms towards 500 - 2*150 =
		// 200ms as the smoothed round trip catches up (about 335ms on average
		// over 3s).
		{"slow", 150 * time.Millisecond, 170 * time.Millisecond, 420 * time.Millisecond},
		// 300ms replies, slower than the 100ms floor: the next heartbeat
		// goes right after each reply, never before.
		{"slower than the interval", 300 * time.Millisecond, 290 * time.Millisecond, 450 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var arrivals []time.Time
			var overlaps int
			addr := fakeServer(t, func(c net.Conn) {
				if _, err := ReadFrame(c); err != nil {
					return
				}
				writeFrame(c, Frame{Type: TypeAcquired, Token: 7})
				replied := make(chan struct{}, 1)
				replied <- struct{}{}
				for {
					if _, err := ReadFrame(c); err != nil {
						return
					}
					mu.Lock()
					arrivals = append(arrivals, time.Now())
					select {
					case <-replied:
					default:
						overlaps++ // a heartbeat before the last one was answered
					}
					mu.Unlock()
					go func() {
						time.Sleep(tc.replyDelay)
						replied <- struct{}{} // before the reply can reach the client
						writeFrame(c, Frame{Type: TypeAcquired, Token: 7})
					}()
				}
			})
			c := New(Config{Address: addr})
			err := c.Do(context.Background(), "hb", lease, func(ctx context.Context, token uint64) error {
				select {
				case <-time.After(3 * time.Second):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if overlaps > 0 {
				t.Fatalf("%d heartbeats sent while another was in flight", overlaps)
			}
			if len(arrivals) < 4 {
				t.Fatalf("only %d heartbeats in 3s", len(arrivals))
			}
			var longest time.Duration
			for i := 1; i < len(arrivals); i++ {
				longest = max(longest, arrivals[i].Sub(arrivals[i-1]))
			}
			mean := arrivals[len(arrivals)-1].Sub(arrivals[0]) / time.Duration(len(arrivals)-1)
			if mean < tc.minMean || mean > tc.maxMean {
				t.Errorf("mean interval %v, want %v to %v", mean, tc.minMean, tc.maxMean)
			}
			if tc.replyDelay < lease/4 && longest > lease/4+150*time.Millisecond {
				t.Errorf("longest interval %v, more than a quarter of the lease", longest)
			}
		})
	}
}

// The smoothed round trip that shortens the heartbeat interval is the
// specification's EWMA with alpha 0.2, its first sample taken as it is
// (docs/protocol.md, the client's rules). Each answer to a request in
// flight is one sample.
func TestSmoothedRoundTripIsTheSpecsEWMA(t *testing.T) {
	l := &Lock{st: holding, token: 7}
	sent := time.Now()
	for _, step := range []struct{ rtt, want time.Duration }{
		{100 * time.Millisecond, 100 * time.Millisecond}, // the first, as it is
		{200 * time.Millisecond, 120 * time.Millisecond}, // 100 + (200-100)/5
		{20 * time.Millisecond, 100 * time.Millisecond},  // 120 + (20-120)/5
	} {
		l.inflight, l.lastSend = true, sent
		if err := l.judge(Frame{Type: TypeAcquired, Token: 7}, sent.Add(step.rtt)); err != nil {
			t.Fatalf("judge: %v", err)
		}
		if l.srtt != step.want {
			t.Errorf("after a round trip of %v the smoothed round trip is %v, want %v", step.rtt, l.srtt, step.want)
		}
	}
}

func TestHeartbeatInterval(t *testing.T) {
	for _, tc := range []struct {
		lease, srtt, want time.Duration
	}{
		{4 * time.Second, 0, time.Second},
		{4 * time.Second, 100 * time.Millisecond, 800 * time.Millisecond},
		{4 * time.Second, 450 * time.Millisecond, 100 * time.Millisecond}, // below the floor
		{4 * time.Second, 10 * time.Second, 100 * time.Millisecond},
		{200 * time.Millisecond, 0, 50 * time.Millisecond}, // the floor never exceeds a quarter
		{200 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond},
		{time.Millisecond, 0, 250 * time.Microsecond},
	} {
		if got := heartbeatInterval(tc.lease, tc.srtt); got != tc.want {
			t.Errorf("heartbeatInterval(%v, %v) = %v, want %v", tc.lease, tc.srtt, got, tc.want)
		}
	}
}

func TestPanicReleasesThenRepanics(t *testing.T) {
	addr := startServer(t, &Server{})
	c := New(Config{Address: addr})
	waiter := dialRaw(t, addr)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic of fn", r)
			}
		}()
		c.Do(context.Background(), "p", time.Minute, func(ctx context.Context, token uint64) error {
			waiter.send(acquire("p", time.Minute))
			waiter.expectWaiting()
			panic("boom")
		})
	}()
	waiter.expectAcquired() // already released when the panic reached us
}

func TestCancellingDoWhileFnRunsIsGraceful(t *testing.T) {
	addr := startServer(t, &Server{})
	c := New(Config{Address: addr})
	ctx, cancel := context.WithCancelCause(context.Background())
	stopReason := errors.New("deploy aborted")
	waiter := dialRaw(t, addr)
	const lease = 400 * time.Millisecond
	err := c.Do(ctx, "g", lease, func(fnCtx context.Context, token uint64) error {
		waiter.send(acquire("g", time.Minute))
		waiter.expectWaiting()
		cancel(stopReason)
		clientWait(t, fnCtx.Done(), wait, "fn's context to be cancelled by Do's")
		if cause := context.Cause(fnCtx); cause != stopReason {
			t.Errorf("fn's cause %v, want Do's cause", cause)
		}
		// Wind down for several leases: the lock must stay ours meanwhile.
		time.Sleep(3 * lease)
		waiter.send(heartbeat)
		waiter.expectWaiting()
		return nil
	})
	if err != nil {
		t.Fatalf("Do = %v, want nil: a graceful stop reports no loss", err)
	}
	waiter.expectAcquired()
}

func TestCancellingWhileQueuedFreesThePlace(t *testing.T) {
	addr := startServer(t, &Server{})
	holder := dialRaw(t, addr)
	holder.send(acquire("q", time.Minute))
	holder.expectAcquired()
	c := New(Config{Address: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	ran := false
	err := c.Do(ctx, "q", time.Minute, func(context.Context, uint64) error { ran = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Fatalf("Do = %v (fn ran: %v), want the context's deadline", err, ran)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Do returned %v after its context ended", d)
	}
	for _, sentinel := range []error{ErrDial, ErrLockLost, ErrBusy, ErrConnectionClosed} {
		if errors.Is(err, sentinel) {
			t.Errorf("cancellation while queued also matches %v", sentinel)
		}
	}
	// The place is free: the next client behind the holder is first in line.
	next := dialRaw(t, addr)
	next.send(acquire("q", time.Minute))
	next.expectWaiting()
	holder.Close()
	next.expectAcquired()
}

func TestTryAcquire(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	c := New(Config{Address: addr})
	l, err := c.TryAcquire(context.Background(), "t", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(context.Background(), "t", time.Second); !errors.Is(err, ErrBusy) {
		t.Fatalf("second TryAcquire = %v, want ErrBusy", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("second Release = %v", err)
	}
	if !errors.Is(l.Err(), ErrReleased) {
		t.Fatalf("Err after Release = %v", l.Err())
	}
	// The busy try left no place in the queue: the lock is free again once
	// the server has read the release.
	waitFor(t, "the release to reach the server", func() bool { return len(srv.Locks()) == 0 })
	l2, err := c.TryAcquire(context.Background(), "t", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after Release = %v", err)
	}
	l2.Release()
}

func TestLockHandleReportsLoss(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	c := New(Config{Address: addr})
	l, err := c.Acquire(context.Background(), "h", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l.Err() != nil || l.Name() != "h" || l.Token() == 0 {
		t.Fatalf("fresh lock: err %v, name %q, token %d", l.Err(), l.Name(), l.Token())
	}
	srv.Shutdown(context.Background())
	select {
	case <-l.Done():
	case <-time.After(wait):
		t.Fatal("no loss reported after shutdown")
	}
	var se *ServerError
	if !errors.Is(l.Err(), ErrLockLost) || !errors.Is(l.Err(), ErrShuttingDown) || !errors.As(l.Err(), &se) {
		t.Fatalf("cause %v, want ErrLockLost and ERROR 0x01", l.Err())
	}
	if context.Cause(l.Context()) != l.Err() {
		t.Fatalf("context cause %v, Err %v", context.Cause(l.Context()), l.Err())
	}
	if err := l.Release(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release after a loss = %v, want the loss", err)
	}
}

// After a heartbeat timeout the connection stays open, silent, until
// Release, so the server does not grant the lock while the work stops;
// without a Release it is let go a lease later.
func TestLostLockKeepsItsConnectionUntilRelease(t *testing.T) {
	const lease = 2 * time.Second
	addr := startServer(t, &Server{})
	p := startProxy(t, addr)
	c := New(Config{Address: p.addr})
	for _, release := range []bool{true, false} {
		l, err := c.Acquire(context.Background(), "linger", lease)
		if err != nil {
			t.Fatal(err)
		}
		p.set(down, fault{drop: true}) // the server still hears the client
		clientWait(t, l.Done(), wait, "the heartbeat timeout")
		lost := time.Now()
		if !errors.Is(l.Err(), ErrHeartbeatTimeout) {
			t.Fatalf("cause %v, want a heartbeat timeout", l.Err())
		}
		w := dialRaw(t, addr)
		w.send(acquire("linger", time.Minute))
		w.expectWaiting()
		if release {
			// The guarded work stopping. The server would drop the session
			// at the earliest a quarter of a lease after this, a lease
			// after the heartbeat that followed the last confirmed one.
			w.expectSilence(lease / 10)
			l.Release()
		}
		w.expectAcquired()
		// The server drops the silent session a lease after the last
		// heartbeat it read, at most 0.8 of a lease before the loss.
		if d := time.Since(lost); !release && d < lease/10 {
			t.Fatalf("granted %v after the loss without a Release: the connection was not kept", d)
		}
		select {
		case <-l.done:
		case <-time.After(2 * lease):
			t.Fatalf("release %v: the lock's goroutine still runs %v after the loss", release, time.Since(lost))
		}
		p.set(down, fault{})
		w.Close()
	}
}

func TestLossWhileFnRunsIsJoinedWithFnError(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	c := New(Config{Address: addr})
	fnErr := errors.New("half done")
	err := c.Do(context.Background(), "j", time.Minute, func(ctx context.Context, token uint64) error {
		go srv.Shutdown(context.Background())
		clientWait(t, ctx.Done(), wait, "fn's context to be cancelled by the shutdown")
		if !errors.Is(context.Cause(ctx), ErrShuttingDown) {
			t.Errorf("fn's cause %v", context.Cause(ctx))
		}
		return fnErr
	})
	if !errors.Is(err, fnErr) || !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("Do = %v, want fn's error joined with the loss", err)
	}
	err = New(Config{Address: startServer(t, &Server{})}).Do(context.Background(), "j", time.Minute,
		func(ctx context.Context, token uint64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
}

func TestErrorsForEveryCode(t *testing.T) {
	codes := []Code{0x01, 0x02, 0x05, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1f, 0xff}
	for _, code := range codes {
		t.Run(fmt.Sprintf("0x%02x", uint8(code)), func(t *testing.T) {
			addr := fakeServer(t, func(c net.Conn) {
				ReadFrame(c)
				writeFrame(c, Frame{Type: TypeError, Code: code, Reason: "x"})
			})
			_, err := New(Config{Address: addr}).Acquire(context.Background(), "c", time.Second)
			var se *ServerError
			if !errors.As(err, &se) || se.Code != code || se.Temporary() != (code < 0x10) {
				t.Fatalf("Acquire = %v, want *ServerError 0x%02x", err, uint8(code))
			}
			if sentinel := code.Err(); sentinel != nil && !errors.Is(err, sentinel) {
				t.Fatalf("%v does not match %v", err, sentinel)
			}
			for _, other := range []error{ErrLockLost, ErrDial, ErrBusy, ErrConnectionClosed, ErrInvalidInput} {
				if errors.Is(err, other) {
					t.Fatalf("%v also matches %v", err, other)
				}
			}
		})
	}
}

func TestProtocolViolations(t *testing.T) {
	acquired := []byte{TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1}
	cat := func(parts ...[]byte) []byte { return []byte(strings.Join(toStrings(parts), "")) }
	for _, tc := range []struct {
		name           string
		answer         []byte // right after the ACQUIRE
		afterHeartbeat []byte
	}{
		{"garbage", []byte{0x7f, 0, 0}, nil},
		{"client frame", []byte{TypeAcquire}, nil},
		{"unsolicited WAITING", cat(acquired, []byte{TypeWaiting}), nil},
		{"unsolicited ACQUIRED", cat(acquired, acquired), nil},
		{"WAITING after ACQUIRED", acquired, []byte{TypeWaiting}},
		{"another token", acquired, []byte{TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			closed := make(chan struct{})
			addr := fakeServer(t, func(c net.Conn) {
				defer close(closed)
				c.SetReadDeadline(time.Now().Add(wait))
				ReadFrame(c)
				c.Write(tc.answer)
				if tc.afterHeartbeat != nil {
					if _, err := ReadFrame(c); err != nil {
						return
					}
					c.Write(tc.afterHeartbeat)
				}
				for { // until the client closes its side
					if _, err := ReadFrame(c); err != nil {
						return
					}
				}
			})
			l, err := New(Config{Address: addr}).Acquire(context.Background(), "v", 400*time.Millisecond)
			if err == nil {
				clientWait(t, l.Done(), wait, "the loss")
				err = l.Err()
			}
			if !errors.Is(err, ErrProtocolViolation) {
				t.Fatalf("got %v, want ErrProtocolViolation", err)
			}
			select {
			case <-closed:
			case <-time.After(wait):
				t.Fatal("the client kept the connection open")
			}
		})
	}
}

func toStrings(parts [][]byte) []string {
	var s []string
	for _, p := range parts {
		s = append(s, string(p))
	}
	return s
}

func TestValidationBeforeDial(t *testing.T) {
	dialed := false
	c := New(Config{Address: "127.0.0.1:1", Dialer: dialerFunc(func(context.Context, string, string) (net.Conn, error) {
		dialed = true
		return nil, errors.New("dialed")
	})})
	for _, tc := range []struct {
		name  string
		lease time.Duration
		want  error
	}{
		{"", time.Second, ErrEmptyName},
		{strings.Repeat("x", 256), time.Second, ErrNameTooLong},
		{"\xff", time.Second, ErrInvalidUTF8},
		{"ok", 0, ErrInvalidLease},
		{"ok", -time.Second, ErrInvalidLease},
	} {
		err := c.DoRetry(bounded(t), tc.name, tc.lease, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%q, %v: %v, want %v", tc.name, tc.lease, err, tc.want)
		}
	}
	if dialed {
		t.Fatal("dialed with invalid input")
	}
}

func TestDialErrorIsKeptAndMarked(t *testing.T) {
	addr, _ := refusing(t)
	_, err := New(Config{Address: addr}).Acquire(context.Background(), "d", time.Second)
	var op *net.OpError
	if !errors.Is(err, ErrDial) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("Acquire = %v, want the dial error marked ErrDial", err)
	}
	if errors.Is(err, ErrConnectionClosed) || errors.Is(err, ErrLockLost) {
		t.Fatalf("%v matches more than ErrDial", err)
	}
}

func TestDoRetry(t *testing.T) {
	t.Run("refused dial, then a server", func(t *testing.T) {
		addr, listen := refusing(t)
		go func() {
			time.Sleep(500 * time.Millisecond)
			l, err := listen()
			if err != nil {
				t.Error(err)
				return
			}
			srv := &Server{}
			t.Cleanup(func() { srv.Close() })
			srv.Serve(l)
		}()
		runs := 0
		err := New(Config{Address: addr}).DoRetry(bounded(t), "r", time.Second,
			func(context.Context, uint64) error { runs++; return nil })
		if err != nil || runs != 1 {
			t.Fatalf("DoRetry = %v after %d runs", err, runs)
		}
	})
	t.Run("a listener that closes its first connections, then serves", func(t *testing.T) {
		// What a balancer in front of a dead or starting backend looks like.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl := &closingListener{Listener: l}
		cl.left.Store(3)
		srv := &Server{}
		addr := serveOn(t, srv, cl)
		runs := 0
		err = New(Config{Address: addr}).DoRetry(bounded(t), "r", time.Second,
			func(context.Context, uint64) error { runs++; return nil })
		if err != nil || runs != 1 || cl.left.Load() >= 0 {
			t.Fatalf("DoRetry = %v after %d runs, %d closes left", err, runs, max(cl.left.Load(), 0))
		}
		// AcquireRetry, the same retries, returns the held lock.
		cl.left.Store(2)
		lock, err := New(Config{Address: addr}).AcquireRetry(bounded(t), "r", time.Second)
		if err != nil || cl.left.Load() >= 0 {
			t.Fatalf("AcquireRetry = %v, %d closes left", err, max(cl.left.Load(), 0))
		}
		if info, ok := srv.Lock("r"); !ok || info.Holder == nil || info.Holder.Token != lock.Token() || lock.Err() != nil {
			t.Fatalf("server's view %+v, lock's token %d, Err %v", info, lock.Token(), lock.Err())
		}
		lock.Release()
	})
	for _, stop := range []struct {
		name string
		stop func(*Server)
	}{
		{"a server killed while queued and restarted", func(srv *Server) {
			srv.Close()                        // every connection cut, no ERROR
			time.Sleep(300 * time.Millisecond) // refused meanwhile
		}},
		{"shutdown while queued, then a new server", func(srv *Server) {
			srv.Shutdown(context.Background()) // ERROR 0x01 to the queued client
		}},
	} {
		t.Run(stop.name, func(t *testing.T) {
			srv := &Server{}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			go srv.Serve(l)
			holder := dialRaw(t, addr)
			holder.send(acquire("r", time.Minute))
			holder.expectAcquired()
			var attempts, runs atomic.Int32
			c := New(Config{Address: addr, Dialer: dialerFunc(func(ctx context.Context, n, a string) (net.Conn, error) {
				attempts.Add(1)
				return (&net.Dialer{}).DialContext(ctx, n, a)
			})})
			done := make(chan error, 1)
			go func() {
				done <- c.DoRetry(bounded(t), "r", time.Second, func(context.Context, uint64) error { runs.Add(1); return nil })
			}()
			waitFor(t, "the client to queue", func() bool {
				l, ok := srv.Lock("r")
				return ok && len(l.Waiters) == 1
			})
			stop.stop(srv)
			var l2 net.Listener
			waitFor(t, "the address to be free", func() bool {
				l2, err = net.Listen("tcp", addr)
				return err == nil
			})
			serveOn(t, &Server{}, l2)
			if err := clientWait(t, done, 2*wait, "DoRetry to return"); err != nil || runs.Load() != 1 || attempts.Load() < 2 {
				t.Fatalf("DoRetry = %v after %d runs and %d attempts", err, runs.Load(), attempts.Load())
			}
		})
	}
	t.Run("client error stops at once", func(t *testing.T) {
		var attempts atomic.Int32
		addr := fakeServer(t, func(c net.Conn) {
			attempts.Add(1)
			ReadFrame(c)
			writeFrame(c, Frame{Type: TypeError, Code: CodeEmptyName, Reason: "empty lock name"})
		})
		err := New(Config{Address: addr}).DoRetry(bounded(t), "x", time.Second,
			func(context.Context, uint64) error { t.Error("fn ran"); return nil })
		if !errors.Is(err, ErrEmptyName) || attempts.Load() != 1 {
			t.Fatalf("DoRetry = %v after %d attempts, want 0x14 after one", err, attempts.Load())
		}
	})
	t.Run("fn runs once even when the lock is lost", func(t *testing.T) {
		srv := &Server{}
		addr := startServer(t, srv)
		runs := 0
		err := New(Config{Address: addr}).DoRetry(bounded(t), "once", time.Second,
			func(ctx context.Context, token uint64) error {
				runs++
				go srv.Shutdown(context.Background())
				clientWait(t, ctx.Done(), wait, "fn's context to be cancelled by the shutdown")
				return nil
			})
		if !errors.Is(err, ErrLockLost) || runs != 1 {
			t.Fatalf("DoRetry = %v after %d runs", err, runs)
		}
	})
	t.Run("context ends during backoff", func(t *testing.T) {
		addr, _ := refusing(t)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		err := New(Config{Address: addr}).DoRetry(ctx, "r", time.Second, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrDial) {
			t.Fatalf("DoRetry = %v, want only the context's deadline", err)
		}
	})
}

// A frame that arrives after the claim's deadline confirms nothing, even
// if it was already waiting when the deadline passed. The heartbeat's
// answer is read just before the deadline and then held, on the only
// processor, until just after it: a client that picks the frame over its
// own expired deadline would extend the claim with it.
func TestFrameAfterTheDeadlineConfirmsNothing(t *testing.T) {
	const lease = 400 * time.Millisecond // deadline 320ms after the ACQUIRE
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var acquireSent atomic.Pointer[time.Time]
	addr := fakeServer(t, func(c net.Conn) {
		if _, err := ReadFrame(c); err != nil {
			return
		}
		answered := time.Now()
		writeFrame(c, Frame{Type: TypeAcquired, Token: 7})
		if _, err := ReadFrame(c); err != nil { // the first heartbeat
			return
		}
		time.Sleep(time.Until(answered.Add(lease*8/10 - 3*time.Millisecond)))
		for writeFrame(c, Frame{Type: TypeAcquired, Token: 7}) == nil {
			if _, err := ReadFrame(c); err != nil {
				return
			}
		}
	})
	reads := 0
	c := New(Config{Address: addr, Dialer: dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, address)
		return &hookConn{Conn: conn,
			beforeWrite: func([]byte) error {
				now := time.Now()
				acquireSent.CompareAndSwap(nil, &now)
				return nil
			},
			afterRead: func(n int, _ error) {
				if n == 0 {
					return
				}
				if reads++; reads == 2 { // the heartbeat's answer: hold it past the deadline
					for until := acquireSent.Load().Add(lease*8/10 + 2*time.Millisecond); time.Now().Before(until); {
					}
				}
			}}, err
	})})
	l, err := c.Acquire(context.Background(), "late", lease)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	select {
	case <-l.Done():
	case <-time.After(lease):
		t.Fatalf("still held %v after the ACQUIRE: the late answer extended the claim", time.Since(*acquireSent.Load()))
	}
	if !errors.Is(l.Err(), ErrHeartbeatTimeout) {
		t.Fatalf("cause %v, want a heartbeat timeout", l.Err())
	}
}

// A Dialer may return a tls.Client whose handshake has not run: it then
// runs inside the first write, and reads. Both the caller's context and
// the claim's deadline bound it.
func TestLazyTLSHandshakeIsBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, &tls.Config{})
	t.Cleanup(func() { tl.Close() })
	var mu sync.Mutex
	var held []net.Conn // accepted, never read: the handshake is never answered
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	c := New(Config{Address: l.Addr().String(), Dialer: dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return tls.Client(raw, &tls.Config{InsecureSkipVerify: true}), nil
	})})
	for _, tc := range []struct {
		name    string
		ctx     time.Duration // 0: none
		lease   time.Duration
		want    error
		returns time.Duration // at the latest, with a generous margin
	}{
		{"the caller's context", 300 * time.Millisecond, time.Hour, context.DeadlineExceeded, 300*time.Millisecond + 3*time.Second},
		{"the claim's deadline", 0, time.Second, ErrHeartbeatTimeout, 800*time.Millisecond + 3*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := c.Acquire(ctx, "tls", tc.lease)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Fatalf("Acquire = %v, want %v", err, tc.want)
				}
				if d := time.Since(start); d > tc.returns {
					t.Fatalf("Acquire returned after %v, want within %v", d, tc.returns)
				}
			case <-time.After(tc.returns):
				t.Fatalf("Acquire still waits for the handshake after %v", tc.returns)
			}
		})
	}
}

// A server that closes the connection before any reply (a plain client
// against a TLS port, for one) is reported as exactly that.
func TestClosedBeforeAnyReply(t *testing.T) {
	check := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, ErrConnectionClosed) || !strings.Contains(err.Error(), "closed by the server before any reply") {
			t.Fatalf("Acquire = %v, want the connection closed by the server before any reply", err)
		}
		if errors.Is(err, ErrLockLost) || errors.Is(err, ErrDial) {
			t.Fatalf("%v says more than that", err)
		}
	}
	t.Run("plain close", func(t *testing.T) {
		addr := fakeServer(t, func(c net.Conn) { ReadFrame(c) })
		_, err := New(Config{Address: addr}).Acquire(context.Background(), "x", time.Second)
		check(t, err)
		if !errors.Is(err, io.EOF) {
			t.Fatalf("%v does not keep io.EOF", err)
		}
	})
	t.Run("TLS server", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := serveOn(t, &Server{}, tls.NewListener(l, &tls.Config{}))
		_, err = New(Config{Address: addr}).Acquire(context.Background(), "x", time.Second)
		check(t, err)
	})
}

// clientWait receives from ch within d, or fails the test with what did
// not happen. Only from the test's goroutine.
func clientWait[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("gave up after %v waiting for %s", d, what)
		panic("unreachable")
	}
}

// ErrInvalidInput "comes joined with the sentinel of the code the server
// would have sent": every refused lease should match ErrInvalidLease.
func TestRefusedLeaseMatchesErrInvalidLease(t *testing.T) {
	c := New(Config{Address: "127.0.0.1:1"})
	for _, lease := range []time.Duration{0, 1500 * time.Microsecond, MaxLease + time.Millisecond} {
		err := c.Do(context.Background(), "x", lease, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, ErrInvalidInput) || !errors.Is(err, ErrInvalidLease) {
			t.Errorf("lease %v: Do = %v; Is(ErrInvalidInput)=%v Is(ErrInvalidLease)=%v",
				lease, err, errors.Is(err, ErrInvalidInput), errors.Is(err, ErrInvalidLease))
		}
	}
}

// Holding, no heartbeat in flight: the server sends the first byte of an
// unsolicited ACQUIRED and then nothing. The frame is a violation the
// moment its type byte arrives: the client must not wait for the rest
// until 0.8 of the lease, sending no heartbeats meanwhile.
func TestUnsolicitedFrameIsAViolationAtItsTypeByte(t *testing.T) {
	const lease = time.Second
	hbs := make(chan struct{}, 100)
	addr := fakeServer(t, func(c net.Conn) {
		if _, err := ReadFrame(c); err != nil {
			return
		}
		writeFrame(c, Frame{Type: TypeAcquired, Token: 9})
		time.Sleep(20 * time.Millisecond)
		c.Write([]byte{TypeAcquired})
		for {
			if _, err := ReadFrame(c); err != nil {
				return
			}
			hbs <- struct{}{}
		}
	})
	start := time.Now()
	l, err := New(Config{Address: addr}).Acquire(context.Background(), "x", lease)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	select {
	case <-l.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("never lost")
	}
	took := time.Since(start)
	t.Logf("lost after %v: %v; heartbeats sent meanwhile: %d", took, l.Err(), len(hbs))
	if !errors.Is(l.Err(), ErrProtocolViolation) || took > 300*time.Millisecond {
		t.Errorf("unsolicited frame detected after %v as %v, want a protocol violation at once", took, l.Err())
	}
}

// A server may never send token 0 ("A token is never 0"); a client that
// hands 0 to a fencing resource defeats fencing.
func TestTokenZeroIsRefused(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		if _, err := ReadFrame(c); err != nil {
			return
		}
		writeFrame(c, Frame{Type: TypeAcquired, Token: 0})
		ReadFrame(c)
	})
	l, err := New(Config{Address: addr}).Acquire(context.Background(), "x", time.Second)
	if err == nil {
		defer l.Release()
		t.Errorf("Acquire accepted token 0 (Token()=%d)", l.Token())
	}
}

// Many Releases, concurrent with a loss and with fn; run with -race.
func TestConcurrentReleasesDuringLoss(t *testing.T) {
	for i := range 30 {
		addr := fakeServer(t, func(c net.Conn) {
			if _, err := ReadFrame(c); err != nil {
				return
			}
			writeFrame(c, Frame{Type: TypeAcquired, Token: 5})
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			if i%2 == 0 {
				writeFrame(c, Frame{Type: TypeError, Code: CodeClosedByAdmin})
			}
		})
		l, err := New(Config{Address: addr}).Acquire(context.Background(), "x", 40*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); time.Sleep(time.Duration(i%4) * time.Millisecond); l.Release(); _ = l.Err() }()
		}
		wg.Wait()
		select {
		case <-l.done:
		case <-time.After(2 * time.Second):
			t.Fatal("claim goroutine did not end after Release")
		}
		if e := l.Release(); e != nil && !errors.Is(e, ErrLockLost) {
			t.Fatalf("Release = %v", e)
		}
	}
}

// These tests run in a synctest bubble: time is fake, and advances only
// when every goroutine of the bubble waits, so each instant below is exact.
// The server is a script over net.Pipe.

// pipeClient is a client whose every dial runs serve on the server's end
// of a new in-memory connection.
func pipeClient(serve func(s *script)) *Client {
	return New(Config{Address: "pipe", Dialer: dialerFunc(func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			serve(&script{server})
		}()
		return client, nil
	})})
}

// script is the server's end: it reads and writes whole frames, and says
// false when the client's end has gone.
type script struct{ net.Conn }

func (s *script) read() (Frame, bool) {
	f, err := ReadFrame(s)
	return f, err == nil
}

func (s *script) write(f Frame) bool { return writeFrame(s, f) == nil }

// drain reads until the client closes its end.
func (s *script) drain() { io.Copy(io.Discard, s) }

// waitDone waits for l's loss or release within d of fake time.
func waitDone(t *testing.T, l *Lock, d time.Duration, what string) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(d):
		t.Fatalf("%s: the lock was still believed held %v later", what, d)
	}
}

// A frame that arrives at the claim's deadline confirms nothing, even the
// answer to a heartbeat.
func TestFrameAtTheDeadlineConfirmsNothing(t *testing.T) {
	const lease = time.Second // timeout 800ms; heartbeats every 250ms
	synctest.Test(t, func(t *testing.T) {
		for i := range 200 {
			start := time.Now()
			c := pipeClient(func(s *script) {
				s.read() // ACQUIRE
				s.write(Frame{Type: TypeAcquired, Token: 7})
				s.read() // the heartbeat at 250ms
				time.Sleep(time.Until(start.Add(lease * 8 / 10)))
				s.write(Frame{Type: TypeAcquired, Token: 7}) // its answer, at the deadline
				s.drain()
			})
			l, err := c.Acquire(context.Background(), "late", lease)
			if err != nil {
				t.Fatal(err)
			}
			waitDone(t, l, lease, "an answer at the deadline")
			if d := time.Since(start); d != lease*8/10 || !errors.Is(l.Err(), ErrHeartbeatTimeout) {
				t.Fatalf("run %d: lost at %v with %v, want a heartbeat timeout at exactly %v", i, d, l.Err(), lease*8/10)
			}
			l.Release()
		}
	})
}

// The claim counts from the send of the last confirmed request, never from
// the arrival of its answer: a heartbeat answered late confirms the claim
// from its send, and when the server then falls silent the claim ends 0.8
// of the lease after that send, to the nanosecond.
func TestTimeoutCountsFromTheConfirmedSend(t *testing.T) {
	const lease = time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var hbSent time.Time
		c := pipeClient(func(s *script) {
			s.read()
			s.write(Frame{Type: TypeAcquired, Token: 7})
			s.read() // the first heartbeat, at 250ms
			hbSent = time.Now()
			time.Sleep(300 * time.Millisecond)
			s.write(Frame{Type: TypeAcquired, Token: 7}) // its answer, 300ms late
			s.drain()                                    // and silence
		})
		l, err := c.Acquire(context.Background(), "send", lease)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		waitDone(t, l, 2*lease, "silence after a late answer")
		if want := hbSent.Add(lease * 8 / 10); !time.Now().Equal(want) {
			t.Fatalf("claim abandoned at %v, want %v: 0.8 of the lease after the confirmed heartbeat's send (%v), not after its answer (%v)",
				time.Since(start), want.Sub(start), hbSent.Sub(start), hbSent.Add(300*time.Millisecond).Sub(start))
		}
		if !errors.Is(l.Err(), ErrHeartbeatTimeout) || !errors.Is(l.Err(), ErrLockLost) {
			t.Fatalf("cause %v, want a lost lock by heartbeat timeout", l.Err())
		}
	})
}

// The promotion push confirms nothing: a queued client whose heartbeat is
// lost, then pushed ACQUIRED, still counts from its ACQUIRE.
func TestPushConfirmsNothing(t *testing.T) {
	const lease = time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := pipeClient(func(s *script) {
			s.read()
			s.write(Frame{Type: TypeWaiting})
			s.read() // the heartbeat at 250ms, lost
			time.Sleep(150 * time.Millisecond)
			s.write(Frame{Type: TypeAcquired, Token: 9}) // the push, at 400ms
			s.drain()
		})
		l, err := c.Acquire(context.Background(), "push", lease)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		if d := time.Since(start); d != 400*time.Millisecond || l.Token() != 9 {
			t.Fatalf("granted at %v with token %d, want 400ms and 9", d, l.Token())
		}
		waitDone(t, l, 2*lease, "a push after a lost heartbeat")
		if d := time.Since(start); d != lease*8/10 {
			t.Fatalf("claim abandoned at %v, want %v: 0.8 of the lease after the ACQUIRE, the last confirmed request", d, lease*8/10)
		}
		if !errors.Is(l.Err(), ErrHeartbeatTimeout) || !errors.Is(l.Err(), ErrLockLost) {
			t.Fatalf("cause %v, want a lost lock by heartbeat timeout", l.Err())
		}
	})
}

// Release returns at once, even while a heartbeat's write is blocked on a
// server that stopped reading.
func TestReleaseDoesNotWaitForTheWrite(t *testing.T) {
	const lease = time.Second
	synctest.Test(t, func(t *testing.T) {
		c := pipeClient(func(s *script) {
			s.read()
			s.write(Frame{Type: TypeAcquired, Token: 7})
			time.Sleep(2 * lease) // reads nothing: the heartbeat at 250ms blocks
			s.drain()
		})
		l, err := c.Acquire(context.Background(), "stuck", lease)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		if err := l.Release(); err != nil {
			t.Fatalf("Release = %v, want nil: the claim was not yet lost", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("Release took %v", d)
		}
		time.Sleep(3 * lease) // the script's end
	})
}

// DoRetry waits 100ms, then twice as long each time up to 5s, each wait
// drawn from [base, 1.5×base), and tells OnRetry each attempt and wait.
func TestDoRetryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dials []time.Time
		var told []time.Duration
		errRefused := errors.New("refused")
		c := New(Config{Address: "nowhere", Dialer: dialerFunc(func(context.Context, string, string) (net.Conn, error) {
			dials = append(dials, time.Now())
			return nil, errRefused
		}), OnRetry: func(attempt int, err error, wait time.Duration) {
			if attempt != len(dials) || !errors.Is(err, errRefused) {
				t.Errorf("OnRetry(%d, %v) after %d dials", attempt, err, len(dials))
			}
			told = append(told, wait)
		}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := c.DoRetry(ctx, "r", time.Second, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DoRetry = %v, want the context's deadline", err)
		}
		base, jittered := 100*time.Millisecond, 0
		for i := 1; i < len(dials); i++ {
			wait := dials[i].Sub(dials[i-1])
			if wait != told[i-1] {
				t.Errorf("wait %d: %v, OnRetry was told %v", i, wait, told[i-1])
			}
			if wait < base || wait >= base*3/2 {
				t.Errorf("wait %d: %v, want [%v, %v)", i, wait, base, base*3/2)
			}
			if wait != base {
				jittered++
			}
			base = min(2*base, 5*time.Second)
		}
		if len(dials) < 10 || jittered < len(dials)/2 {
			t.Fatalf("%d dials in a minute, %d waits above their base", len(dials), jittered)
		}
	})
}

// Tiny and huge leases: the first heartbeat at exactly lease/4 after the
// ACQUIRE's send, and the loss at exactly 0.8 of the lease when nothing
// answers it.
func TestHeartbeatAndLossAtLeaseExtremes(t *testing.T) {
	for _, lease := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 401 * time.Millisecond, MaxLease} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			hb := make(chan time.Duration, 10)
			c := pipeClient(func(s *script) {
				if _, ok := s.read(); !ok {
					return
				}
				s.write(Frame{Type: TypeAcquired, Token: 1})
				for {
					if _, ok := s.read(); !ok {
						return
					}
					hb <- time.Since(start)
				}
			})
			l, err := c.Acquire(context.Background(), "x", lease)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			<-l.Done()
			lost := time.Since(start)
			var sends []time.Duration
			for len(hb) > 0 {
				sends = append(sends, <-hb)
			}
			if lost != lease/5*4 || len(sends) != 1 || sends[0] != lease/4 || !errors.Is(l.Err(), ErrHeartbeatTimeout) {
				t.Errorf("lease %v: lost at %v (%v), heartbeats at %v; want loss at %v, one heartbeat at %v",
					lease, lost, l.Err(), sends, lease/5*4, lease/4)
			}
		})
	}
}

// Graceful stop, then a loss while fn is still stopping: the loss is
// joined; no loss: nothing joined and heartbeats went on.
func TestHeartbeatsGoOnWhileFnStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		var hbs atomic.Int32
		c := pipeClient(func(s *script) {
			if _, ok := s.read(); !ok {
				return
			}
			s.write(Frame{Type: TypeAcquired, Token: 1})
			for {
				if _, ok := s.read(); !ok {
					return
				}
				hbs.Add(1)
				if !s.write(Frame{Type: TypeAcquired, Token: 1}) {
					return
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		err := c.Do(ctx, "x", lease, func(fctx context.Context, _ uint64) error {
			<-fctx.Done()
			time.Sleep(3 * time.Second) // stopping slowly, heartbeats go on
			return nil
		})
		if err != nil || hbs.Load() < 10 {
			t.Errorf("Do = %v after %d heartbeats", err, hbs.Load())
		}
	})
}

// Every error the client returns, from each server code, each client error
// and each way a connection ends: the sentinels it matches (and no other),
// what errors.As finds, whether DoRetry retries it and after what first
// wait, and its text, which says each cause once.
func TestEveryErrorItsMatchesAndItsRetry(t *testing.T) {
	errPinned := errors.New("not the pinned certificate")
	sentinels := []error{ErrDial, ErrBusy, ErrLockLost, ErrReleased, ErrHeartbeatTimeout, ErrConnectionClosed,
		ErrProtocolViolation, ErrInvalidInput, context.Canceled, context.DeadlineExceeded, errPinned}
	for c := range 256 {
		if err := Code(c).Err(); err != nil {
			sentinels = append(sentinels, err)
		}
	}
	answer := func(b ...byte) string { // reads the ACQUIRE, answers b, closes
		return fakeServer(t, func(c net.Conn) { ReadFrame(c); c.Write(b) })
	}
	refused, _ := refusing(t)
	plain := startServer(t, &Server{})
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	if err != nil {
		t.Fatal(err)
	}
	withTLS := serveOn(t, &Server{}, tl)
	lazyTLS := dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return tls.Client(c, &tls.Config{ServerName: "127.0.0.1"}), nil
	})
	busy := startServer(t, &Server{})
	dialRaw(t, busy).send(acquire("x", time.Minute))
	const once, never = -1, -2 // fn runs once and DoRetry returns; DoRetry returns at once
	type errCase struct {
		name  string
		addr  string
		dial  Dialer
		lock  string        // "x" if empty
		lease time.Duration // a second if 0
		try   bool          // TryAcquire instead of DoRetry
		wraps bool          // fn returns its context's cause, wrapped
		is    []error       // the sentinels it matches, and no other
		as    func(err error) bool
		wait  time.Duration // the first wait's base: 0 at once, once or never
	}
	cases := []errCase{
		{name: "refused", addr: refused, is: []error{ErrDial}, wait: 100 * time.Millisecond,
			as: func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }},
		{name: "reset before any reply", wait: 100 * time.Millisecond, is: []error{ErrConnectionClosed},
			addr: fakeServer(t, func(c net.Conn) { ReadFrame(c); c.(*net.TCPConn).SetLinger(0) }),
			as:   func(err error) bool { return errors.Is(err, syscall.ECONNRESET) }},
		{name: "closed before any reply", addr: answer(), is: []error{ErrConnectionClosed}, wait: 100 * time.Millisecond,
			as: func(err error) bool {
				return errors.Is(err, io.EOF) && strings.Contains(err.Error(), "before any reply")
			}},
		{name: "plain client, TLS server", addr: withTLS, is: []error{ErrConnectionClosed}, wait: 100 * time.Millisecond},
		{name: "silent", lease: 100 * time.Millisecond, is: []error{ErrHeartbeatTimeout}, wait: 100 * time.Millisecond,
			addr: fakeServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })},
		{name: "closed after ACQUIRED", addr: answer(TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1), wait: once,
			is: []error{ErrLockLost, ErrConnectionClosed}, as: func(err error) bool { return errors.Is(err, io.EOF) }},
		{name: "closed after ACQUIRED, fn returns the cause", addr: answer(TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1), wait: once,
			wraps: true, is: []error{ErrLockLost, ErrConnectionClosed}},
		{name: "ERROR after ACQUIRED", addr: answer(TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1, TypeError, 0x02, 0), wait: once,
			is: []error{ErrLockLost, ErrClosedByAdmin}, as: func(err error) bool { var se *ServerError; return errors.As(err, &se) }},
		{name: "TLS verification failure", addr: withTLS, dial: &tls.Dialer{}, is: []error{ErrDial}, wait: never,
			as: func(err error) bool { var ve *tls.CertificateVerificationError; return errors.As(err, &ve) }},
		{name: "TLS verification failure, lazy handshake", addr: withTLS, dial: lazyTLS, is: []error{ErrConnectionClosed}, wait: never,
			as: func(err error) bool { var ve *tls.CertificateVerificationError; return errors.As(err, &ve) }},
		{name: "refused by the dialer's own VerifyConnection", addr: withTLS, is: []error{ErrDial, errPinned}, wait: never,
			dial: &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true,
				VerifyConnection: func(tls.ConnectionState) error { return errPinned }}},
			as: func(err error) bool { var ve *tls.CertificateVerificationError; return errors.As(err, &ve) }},
		{name: "refused by the dialer's own VerifyPeerCertificate", addr: withTLS, is: []error{ErrDial, errPinned}, wait: never,
			dial: &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true,
				VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error { return errPinned }}},
			as: func(err error) bool { var ve *tls.CertificateVerificationError; return errors.As(err, &ve) }},
		{name: "TLS client, plain server", addr: plain, dial: &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}},
			is: []error{ErrDial}, wait: 100 * time.Millisecond},
		{name: "protocol violation", addr: answer(0x7f), is: []error{ErrProtocolViolation}, wait: never},
		{name: "busy", addr: busy, try: true, is: []error{ErrBusy}, wait: never},
		{name: "empty name", addr: plain, lock: "\x00", is: []error{ErrInvalidInput, ErrEmptyName}, wait: never},
		{name: "name too long", addr: plain, lock: strings.Repeat("x", 256), is: []error{ErrInvalidInput, ErrNameTooLong}, wait: never},
		{name: "name not UTF-8", addr: plain, lock: "\xff", is: []error{ErrInvalidInput, ErrInvalidUTF8}, wait: never},
		{name: "lease not positive", addr: plain, lease: -time.Second, is: []error{ErrInvalidInput, ErrInvalidLease}, wait: never},
	}
	for c := Code(0x01); c <= 0x19; c++ {
		tc := errCase{name: fmt.Sprintf("code 0x%02x", uint8(c)), is: []error{}, wait: 100 * time.Millisecond,
			as: func(err error) bool {
				var se *ServerError
				return errors.As(err, &se) && se.Code == c && se.Temporary() == (c < 0x10)
			}}
		if c.Err() != nil {
			tc.is = append(tc.is, c.Err())
		}
		reason := cmp.Or(c.Err(), error(errors.New("a reason from a newer server"))).Error()
		tc.addr = answer(append([]byte{TypeError, byte(c), byte(len(reason))}, reason...)...)
		switch {
		case c == CodeShuttingDown:
			tc.wait = 0
		case c >= 0x10:
			tc.wait = never
		}
		cases = append(cases, tc)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(bounded(t))
			defer cancel(nil)
			errStop := errors.New("the test's stop")
			var retried []error
			var waits []time.Duration
			c := New(Config{Address: tc.addr, Dialer: tc.dial, OnRetry: func(attempt int, err error, wait time.Duration) {
				if attempt != len(retried)+1 {
					t.Errorf("attempt %d after %d retries", attempt, len(retried))
				}
				retried, waits = append(retried, err), append(waits, wait)
				cancel(errStop)
			}})
			lock, lease := cmp.Or(tc.lock, "x"), cmp.Or(tc.lease, time.Second)
			if lock == "\x00" {
				lock = ""
			}
			runs := 0
			var err error
			if tc.try {
				_, err = c.TryAcquire(ctx, lock, lease)
			} else {
				err = c.DoRetry(ctx, lock, lease, func(ctx context.Context, _ uint64) error {
					runs++
					clientWait(t, ctx.Done(), wait, "the loss")
					if tc.wraps {
						return fmt.Errorf("import stopped: %w", context.Cause(ctx))
					}
					return nil
				})
			}
			switch {
			case tc.wait == once && (runs != 1 || len(retried) != 0):
				t.Fatalf("fn ran %d times, %d retries; want once and none", runs, len(retried))
			case tc.wait == never && len(retried) != 0:
				t.Fatalf("DoRetry retried %v; want it returned at once", retried[0])
			case tc.wait >= 0 && len(retried) == 0:
				t.Fatalf("DoRetry returned %v; want it retried", err)
			case tc.wait >= 0:
				if !errors.Is(err, errStop) {
					t.Errorf("DoRetry = %v, want the context's cause", err)
				}
				if waits[0] < tc.wait || waits[0] > tc.wait*3/2 || tc.wait > 0 && waits[0] == tc.wait*3/2 {
					t.Errorf("first wait %v, want [%v, %v)", waits[0], tc.wait, tc.wait*3/2)
				}
				err = retried[0]
			}
			if tc.wait != once && runs != 0 {
				t.Errorf("fn ran %d times", runs)
			}
			for _, s := range sentinels {
				if want := slices.Contains(tc.is, s); errors.Is(err, s) != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, s, !want, want)
				}
			}
			if tc.as != nil && !tc.as(err) {
				t.Errorf("%v: errors.As or errors.Is does not find the cause", err)
			}
			if msg := err.Error(); strings.Count(msg, "monolock:") > 1 || strings.Contains(msg, "\n") {
				t.Errorf("%q says something twice", msg)
			}
			t.Logf("%v", err)
		})
	}
}

// closingListener closes the first left connections it accepts.
type closingListener struct {
	net.Listener
	left atomic.Int32
}

func (l *closingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.left.Add(-1) < 0 {
			return c, err
		}
		c.Close()
	}
}

// The end of ctx at any point of a claim returns ctx's error with its
// cause, whatever the dialer or the connection said meanwhile. A context
// with a deadline passes it a moment before its timer ends it: a dialer
// that stops at the deadline returns its own error in between, which
// happened in 8 runs of 10,000. lateContext widens that moment to 50ms.
func TestContextEndAtEveryPointOfAClaim(t *testing.T) {
	errCause := errors.New("the caller's cause")
	addr := startServer(t, &Server{})
	holder := dialRaw(t, addr)
	holder.send(acquire("held", time.Minute))
	holder.expectAcquired()
	silent := fakeServer(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // never answers a handshake
	untilDone := dialerFunc(func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done()
		return nil, errors.New("the dialer's own error")
	})
	atDeadline := dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		d, _ := ctx.Deadline()
		time.Sleep(time.Until(d))
		return (&net.Dialer{}).DialContext(ctx, network, address) // "i/o timeout", before ctx ends
	})
	closesAtDeadline := dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if d, ok := ctx.Deadline(); ok && err == nil {
			time.AfterFunc(time.Until(d), func() { c.Close() }) // a connection bound to ctx's deadline
		}
		return c, err
	})
	insecure := &tls.Config{InsecureSkipVerify: true}
	lazyTLS := dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return tls.Client(c, insecure), nil
	})
	for _, tc := range []struct {
		name string
		addr string
		dial Dialer
		lock string
		end  time.Duration // after the call; negative: before it
		late bool          // the deadline passes 50ms before the context ends
	}{
		{name: "before the dial", addr: addr, end: -1},
		{name: "before the dial, its deadline passed", addr: addr, end: -time.Millisecond, late: true},
		{name: "during the dial", addr: addr, dial: untilDone, end: 50 * time.Millisecond},
		{name: "during the dial, at its deadline", addr: addr, dial: atDeadline, end: 50 * time.Millisecond, late: true},
		{name: "during the TLS handshake", addr: silent, dial: &tls.Dialer{Config: insecure}, end: 50 * time.Millisecond},
		{name: "during a lazy TLS handshake", addr: silent, dial: lazyTLS, end: 50 * time.Millisecond},
		{name: "while queued", addr: addr, lock: "held", end: 50 * time.Millisecond},
		{name: "while queued, at its deadline", addr: addr, lock: "held", end: 50 * time.Millisecond, late: true},
		{name: "while queued, closed at its deadline", addr: addr, dial: closesAtDeadline, lock: "held", end: 50 * time.Millisecond, late: true},
		{name: "after the grant", addr: addr, end: 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var ctx context.Context
			var cancel context.CancelFunc
			if tc.late {
				ctx, cancel = context.WithTimeoutCause(context.Background(), tc.end+50*time.Millisecond, errCause)
				ctx = lateContext{ctx, time.Now().Add(tc.end)}
			} else {
				ctx, cancel = context.WithTimeoutCause(context.Background(), max(tc.end, 0), errCause)
			}
			defer cancel()
			ran := false
			done := make(chan error, 1)
			go func() {
				done <- New(Config{Address: tc.addr, Dialer: tc.dial}).Do(ctx, cmp.Or(tc.lock, "free"), time.Hour,
					func(fnCtx context.Context, _ uint64) error {
						ran = true
						<-fnCtx.Done()
						return context.Cause(fnCtx)
					})
			}()
			err := clientWait(t, done, wait, "Do to return")
			if !errors.Is(err, errCause) || !ran && !errors.Is(err, context.DeadlineExceeded) ||
				errors.Is(err, ErrDial) || errors.Is(err, ErrLockLost) || errors.Is(err, ErrConnectionClosed) {
				t.Fatalf("Do = %v (fn ran: %v); want only the context's error and its cause", err, ran)
			}
		})
	}
}

// The same with real deadlines, spread over the length of a claim, enough
// times to meet a window of 1 in 1,000 (99% of the time).
func TestContextEndAtRandomPointsOfAClaim(t *testing.T) {
	errCause := errors.New("the caller's cause")
	c := New(Config{Address: startServer(t, &Server{})})
	nop := func(context.Context, uint64) error { return nil }
	var took []time.Duration
	for range 21 {
		start := time.Now()
		if err := c.Do(bounded(t), "x", time.Hour, nop); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	span := took[10] * 3 / 2 // the median claim, and some
	granted := 0
	for range 5000 {
		ctx, cancel := context.WithTimeoutCause(context.Background(), rand.N(span), errCause)
		err := c.Do(ctx, "x", time.Hour, nop)
		cancel()
		if err == nil {
			granted++
		} else if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errCause) || errors.Is(err, ErrDial) {
			t.Fatalf("Do = %v; want nil or only the context's error and its cause", err)
		}
	}
	t.Logf("deadlines within %v of the call: %d of 5000 granted before", span, granted)
}

// ERROR 0x01 is retried at once only once in a row: a server, or a proxy,
// may say it to every attempt, and a client must not spin on it. The
// second 0x01 in a row waits a backoff (100ms to 150ms); the attempt
// after that is again at once.
func TestShuttingDownIsRetriedAtOnceOnlyOnceInARow(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		ReadFrame(c)
		writeFrame(c, Frame{Type: TypeError, Code: CodeShuttingDown, Reason: "server shutting down"})
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait) // a hang ends as DeadlineExceeded
	defer cancel()
	var waits []time.Duration
	c := New(Config{Address: addr, OnRetry: func(attempt int, err error, wait time.Duration) {
		if !errors.Is(err, ErrShuttingDown) {
			t.Errorf("attempt %d: %v, want ERROR 0x01", attempt, err)
		}
		if waits = append(waits, wait); attempt == 3 {
			cancel()
		}
	}})
	if _, err := c.AcquireRetry(ctx, "x", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireRetry = %v, want the context's end", err)
	}
	if len(waits) != 3 || waits[0] != 0 || waits[1] < 100*time.Millisecond || waits[1] >= 150*time.Millisecond || waits[2] != 0 {
		t.Errorf("waits after three ERROR 0x01 in a row: %v, want [0s, 100ms to 150ms, 0s]", waits)
	}
}

// A waiter whose claim ends just closes (docs/protocol.md): only a holder
// that lost its lock keeps its connection, silent, until Release or a
// lease. Here the server sends WAITING and then a byte no server sends;
// it must see the client's close at once, not a lease (5s) later, and
// Acquire must return the violation as soon.
func TestWaiterWhoseClaimEndsClosesAtOnce(t *testing.T) {
	closed := make(chan time.Duration, 1)
	addr := fakeServer(t, func(c net.Conn) {
		ReadFrame(c)
		start := time.Now()
		c.Write([]byte{TypeWaiting, 0x7f})
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, c)
		closed <- time.Since(start)
	})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // a hang ends as DeadlineExceeded
	defer cancel()
	_, err := New(Config{Address: addr}).Acquire(ctx, "x", 5*time.Second)
	if !errors.Is(err, ErrProtocolViolation) {
		t.Errorf("Acquire = %v, want a protocol violation", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Acquire returned after %v, want at once (a waiter does not linger)", d)
	}
	select {
	case d := <-closed:
		if d > time.Second {
			t.Errorf("the server saw the waiter's close %v after the bad byte, want at once", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the server never saw the waiter's close")
	}
}

// lateContext's deadline is its own, earlier than the end of its context.
type lateContext struct {
	context.Context
	deadline time.Time
}

func (c lateContext) Deadline() (time.Time, bool) { return c.deadline, true }

// An error under a context whose deadline has passed but that never ends
// (a Context of the caller's own) is returned within a second, whether
// the dial or the claim met it: the client waits at most that long for
// the end of ctx a moment after its deadline.
func TestErrorUnderAPassedDeadlineThatNeverEndsReturns(t *testing.T) {
	refused, _ := refusing(t)
	closes := fakeServer(t, func(c net.Conn) {
		ReadFrame(c)
		time.Sleep(200 * time.Millisecond)
	}) // then closes
	for _, tc := range []struct {
		name, addr string
		deadline   time.Duration // from now
		want       error
	}{
		{"refused dial", refused, -time.Millisecond, ErrDial},
		{"closed before any reply", closes, 50 * time.Millisecond, ErrConnectionClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := lateContext{context.Background(), time.Now().Add(tc.deadline)}
			done := make(chan error, 1)
			go func() {
				_, err := New(Config{Address: tc.addr}).Acquire(ctx, "x", time.Minute)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Fatalf("Acquire = %v; want %v", err, tc.want)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("Acquire still blocked 3s after the error (ended(ctx) waits on a Done that never closes)")
			}
		})
	}
}

// A client certificate that the server refuses (mutual TLS) can never be
// accepted: DoRetry returns the TLS alert at once instead of retrying it
// until ctx ends (the spec: "a TLS certificate that does not verify
// return[s] at once").
func TestClientCertificateRefusedByTheServerIsNotRetried(t *testing.T) {
	serverCert := selfSigned(t)
	ca := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(serverCert.Certificate[0])
	ca.AddCert(leaf) // clients must present a certificate signed by this; ours is not
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, &Server{}, tl)
	// TLS 1.3 refuses after the client's handshake, at its first read;
	// TLS 1.2 within the handshake, in the dial.
	for _, version := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var retries []error
		c := New(Config{Address: addr,
			Dialer: &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MaxVersion: version,
				Certificates: []tls.Certificate{selfSigned(t)}}},
			OnRetry: func(_ int, err error, _ time.Duration) { retries = append(retries, err) }})
		err = c.DoRetry(ctx, "x", time.Second, func(context.Context, uint64) error { return nil })
		if len(retries) > 0 || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: DoRetry retried %d times and returned %v; want the certificate error at once",
				tls.VersionName(version), len(retries), err)
		}
		if !strings.Contains(err.Error(), addr) && version == tls.VersionTLS12 {
			t.Errorf("%s: %q does not name the address", tls.VersionName(version), err)
		}
		t.Logf("%s: %v", tls.VersionName(version), err)
	}
}

// The end of ctx just after a failed attempt is ctx's error and cause, not
// the attempt's (ErrDial): the dialer starts the cancel just before it
// fails, so that the end of ctx falls on every point of that window.
func TestContextEndJustAfterAFailedAttemptIsCtxsError(t *testing.T) {
	errCause := errors.New("the caller's cause")
	errRefused := errors.New("refused")
	var hits, runs int
	for i := range 20000 {
		ctx, cancel := context.WithCancelCause(context.Background())
		spin := i % 64
		c := New(Config{Address: "x", Dialer: dialerFunc(func(ctx context.Context, _, _ string) (net.Conn, error) {
			var started atomic.Bool
			go func() {
				started.Store(true)
				for range spin {
					runtime.Gosched()
				}
				cancel(errCause)
			}()
			for !started.Load() {
			}
			return nil, errRefused
		})})
		err := c.DoRetry(ctx, "x", time.Second, func(context.Context, uint64) error { return nil })
		cancel(nil)
		runs++
		if !errors.Is(err, errCause) {
			hits++
			if hits == 1 {
				t.Logf("run %d: DoRetry = %v (ErrDial: %v), though ctx had ended", i, err, errors.Is(err, ErrDial))
			}
		}
	}
	if hits > 0 {
		t.Fatalf("%d of %d DoRetry calls returned the attempt's error, not ctx's, after ctx ended", hits, runs)
	}
}

// A refusal by a *tls.Dialer's own VerifyConnection or VerifyPeerCertificate
// is a *tls.CertificateVerificationError, as one from crypto/tls is: it
// names the certificates it refused, which code that reports a refusal
// (UnverifiedCertificates[0].Subject) reads.
func TestCallbackRefusalNamesTheRefusedCertificate(t *testing.T) {
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, &Server{}, tl)
	errPinned := errors.New("not the pinned certificate")
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"VerifyConnection", &tls.Config{InsecureSkipVerify: true,
			VerifyConnection: func(tls.ConnectionState) error { return errPinned }}},
		{"VerifyPeerCertificate", &tls.Config{InsecureSkipVerify: true,
			VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error { return errPinned }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Address: addr, Dialer: &tls.Dialer{Config: tc.cfg}}).AcquireRetry(bounded(t), "x", time.Second)
			var ve *tls.CertificateVerificationError
			if !errors.As(err, &ve) || !errors.Is(err, errPinned) {
				t.Fatalf("AcquireRetry = %v, want a *tls.CertificateVerificationError wrapping the callback's error", err)
			}
			if len(ve.UnverifiedCertificates) == 0 {
				t.Errorf("the CertificateVerificationError names no certificate (UnverifiedCertificates empty): %v", err)
			}
		})
	}
}

// An address that can never be dialled (no port: net's AddrError) is
// invalid input, returned at once, not retried until ctx ends.
func TestAcquireRetryAddressWithoutPortReturnsAtOnce(t *testing.T) {
	var retries atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := New(Config{Address: "127.0.0.1", OnRetry: func(int, error, time.Duration) { retries.Add(1) }}).
		AcquireRetry(ctx, "x", time.Second)
	if retries.Load() != 0 || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AcquireRetry = %v after %v and %d retries; want the address error at once", err,
			time.Since(start).Round(time.Millisecond), retries.Load())
	}
}
