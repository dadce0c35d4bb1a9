package monolock

// Findings of a review that attacked the client, each kept as a test.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ErrInvalidInput "comes joined with the sentinel of the code the server
// would have sent": every refused lease should match ErrInvalidLease.
func TestClientReviewInvalidLeaseSentinel(t *testing.T) {
	c := New(Config{Address: "127.0.0.1:1"})
	for _, lease := range []time.Duration{0, 1500 * time.Microsecond, MaxLease + time.Millisecond} {
		err := c.Do(context.Background(), "x", lease, func(context.Context, uint64) error { return nil })
		if !errors.Is(err, ErrInvalidInput) || !errors.Is(err, ErrInvalidLease) {
			t.Errorf("lease %v: Do = %v; Is(ErrInvalidInput)=%v Is(ErrInvalidLease)=%v",
				lease, err, errors.Is(err, ErrInvalidInput), errors.Is(err, ErrInvalidLease))
		}
	}
}

// A server that closes every connection before any reply (what a TLS
// mismatch or a misaddressed port looks like): DoRetry should not treat
// this as "connection lost while queued" and retry until ctx ends.
func TestClientReviewDoRetryClosedBeforeAnyReply(t *testing.T) {
	var dials atomic.Int32
	addr := fakeServer(t, func(c net.Conn) { dials.Add(1); ReadFrame(c) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := New(Config{Address: addr}).DoRetry(ctx, "x", time.Second, func(context.Context, uint64) error { return nil })
	t.Logf("DoRetry = %v after %d connections", err, dials.Load())
	if dials.Load() > 1 {
		t.Errorf("DoRetry made %d connections to a server that closes before any reply; returned %v", dials.Load(), err)
	}
}

// Holding, no heartbeat in flight: the server sends the first byte of an
// unsolicited ACQUIRED and then nothing. The frame is a violation the
// moment its type byte arrives, but the client waits for the rest until
// 0.8 of the lease, sending no heartbeats meanwhile.
func TestClientReviewUnsolicitedDripDetectedLate(t *testing.T) {
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
func TestClientReviewTokenZero(t *testing.T) {
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
func TestClientReviewReleaseStorm(t *testing.T) {
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
