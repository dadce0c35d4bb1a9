package monolock

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

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
func TestSyncLateFrameConfirmsNothing(t *testing.T) {
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
func TestSyncTimeoutCountsFromTheConfirmedSend(t *testing.T) {
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
func TestSyncPushConfirmsNothing(t *testing.T) {
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
func TestSyncReleaseDoesNotWaitForTheWrite(t *testing.T) {
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
// drawn from [base, 1.5×base).
func TestSyncDoRetryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dials []time.Time
		c := New(Config{Address: "nowhere", Dialer: dialerFunc(func(context.Context, string, string) (net.Conn, error) {
			dials = append(dials, time.Now())
			return nil, errors.New("refused")
		})})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := c.DoRetry(ctx, "r", time.Second, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("DoRetry = %v, want the context's deadline", err)
		}
		base, jittered := 100*time.Millisecond, 0
		for i := 1; i < len(dials); i++ {
			wait := dials[i].Sub(dials[i-1])
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
