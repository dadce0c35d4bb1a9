package monolock

import (
	"errors"
	"math"
	"net"
	"testing"
	"time"
)

// The package's promises (see "Guarantees" in the package documentation),
// each checked end to end on a real server: the grant, the wait and the
// pushed promotion; strict FIFO; fencing tokens that increase, across a
// restart too; the lease's expiry of a silent holder and of a silent
// waiter; a shutdown that tells every session.

func TestGrantWaitAndPushPromotion(t *testing.T) {
	addr := startServer(t, &Server{})
	holder, waiter, token := holderAndWaiter(t, addr, "nightly-import")

	// Heartbeats are answered with the session's state and its own token.
	holder.send(heartbeat)
	holder.expect(Frame{Type: TypeAcquired, Token: token})
	waiter.send(heartbeat)
	waiter.expectWaiting()

	// Closing the holder pushes ACQUIRED to the waiter without any heartbeat.
	holder.Close()
	next := waiter.expectAcquired()
	if next <= token {
		t.Fatalf("promotion token %d not above %d", next, token)
	}
	waiter.send(heartbeat)
	waiter.expect(Frame{Type: TypeAcquired, Token: next})
	waiter.expectSilence(100 * time.Millisecond) // exactly one push
}

func TestFIFOOrderAndLeavingFromTheMiddle(t *testing.T) {
	addr := startServer(t, &Server{})
	holder, waiters, _ := queue(t, addr, "q", 5)
	waiters[2].Close() // leaves from the middle
	order := []int{0, 1, 3, 4}
	prev := holder
	for _, i := range order {
		prev.Close()
		waiters[i].expectAcquired()
		for _, j := range order {
			if j > i {
				waiters[j].send(heartbeat)
				waiters[j].expectWaiting()
			}
		}
		prev = waiters[i]
	}
}

func TestTokensIncreaseAcrossRestart(t *testing.T) {
	var last uint64
	addr := ""
	for range 3 {
		srv := &Server{}
		l, err := net.Listen("tcp", orDefault(addr, "127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		addr = l.Addr().String()
		go srv.Serve(l)
		for _, name := range []string{"a", "b", "c"} {
			c := dialRaw(t, addr)
			c.send(acquire(name, time.Minute))
			token := c.expectAcquired()
			if token <= last {
				t.Fatalf("token %d after %d", token, last)
			}
			last = token
			c.Close()
		}
		if err := srv.Shutdown(bounded(t)); err != nil {
			t.Fatalf("Shutdown did not finish within %v: %v", wait, err)
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestTokenSequence(t *testing.T) {
	srv := &Server{}
	srv.lastToken = 1 << 62 // far above the wall clock: the sequence goes on from here
	a, b := srv.nextTokenLocked(time.Now()), srv.nextTokenLocked(time.Now())
	if a != 1<<62+1 || b != a+1 {
		t.Fatalf("tokens %d, %d after %d", a, b, uint64(1<<62))
	}
	srv.lastToken = 0
	before := uint64(time.Now().UnixNano())
	if got := srv.nextTokenLocked(time.Now()); got < before {
		t.Fatalf("token %d below the wall clock %d", got, before)
	}
}

// Tokens go on from the last one given when it is above the wall clock:
// the next grant, immediate or by promotion, is the last one plus one.
func TestTokensAboveTheClockGoOnByOne(t *testing.T) {
	for _, last := range []uint64{
		uint64(time.Now().Add(time.Hour).UnixNano()), // a clock stepped back an hour since
		math.MaxUint64 / 2,
	} {
		srv := &Server{}
		addr := startServer(t, srv)
		srv.mu.Lock()
		srv.lastToken = last
		srv.mu.Unlock()

		holder, waiter, first := holderAndWaiter(t, addr, "above")
		if first != last+1 {
			t.Fatalf("first grant after %d: token %d, want %d", last, first, last+1)
		}
		holder.Close()
		if second := waiter.expectAcquired(); second != first+1 {
			t.Fatalf("promotion after %d: token %d, want %d", first, second, first+1)
		}
	}
}

func TestExpiryOfSilentHolderAndWaiter(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	const lease = 300 * time.Millisecond
	holder := dialRaw(t, addr)
	sent := time.Now()
	holder.send(acquire("e", lease))
	holder.expectAcquired()
	waiter := dialRaw(t, addr) // heartbeats, so it outlives the holder
	waiter.send(acquire("e", time.Minute))
	waiter.expectWaiting()
	silent := dialRaw(t, addr) // a silent waiter behind it
	silentSent := time.Now()
	silent.send(acquire("e", lease))
	silent.expectWaiting()

	waiter.expectAcquired() // pushed when the silent holder expires
	if held := time.Since(sent); held < lease {
		t.Fatalf("holder dropped after %v, before its lease of %v", held, lease)
	}
	holder.expectClosed(wait) // no ERROR is owed
	silent.expectClosed(wait)
	if d := time.Since(silentSent); d < lease {
		t.Fatalf("waiter dropped after %v, before its lease of %v", d, lease)
	}
	waitFor(t, "the expired waiter to leave the queue", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.locks["e"].waiters.Len() == 0
	})
}

func TestHeartbeatsKeepAShortLeaseAlive(t *testing.T) {
	addr := startServer(t, &Server{})
	const lease = 200 * time.Millisecond
	holder := dialRaw(t, addr)
	holder.send(acquire("hb", lease))
	token := holder.expectAcquired()
	waiter := dialRaw(t, addr)
	waiter.send(acquire("hb", time.Minute))
	waiter.expectWaiting()
	for end := time.Now().Add(10 * lease); time.Now().Before(end); {
		time.Sleep(lease / 8)
		holder.send(heartbeat)
		holder.expect(Frame{Type: TypeAcquired, Token: token})
	}
	waiter.expectSilence(0) // still waiting: the holder never expired
	holder.Close()
	waiter.expectAcquired()
}

func TestShutdownSendsShuttingDownToEverySession(t *testing.T) {
	srv := &Server{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	addr := l.Addr().String()
	holder, waiter, _ := holderAndWaiter(t, addr, "s")
	waiter2 := dialRaw(t, addr)
	waiter2.send(acquire("s", time.Minute))
	waiter2.expectWaiting()
	fresh := dialRaw(t, addr) // connected, nothing sent yet
	waitFor(t, "the server to accept the fresh connection", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) == 4
	})

	if err := srv.Shutdown(bounded(t)); err != nil {
		t.Fatalf("Shutdown did not finish within %v: %v", wait, err)
	}
	// No waiter is promoted during shutdown: everyone reads 0x01 first.
	for _, c := range []*raw{holder, waiter, waiter2, fresh} {
		c.expectError(CodeShuttingDown)
	}
	if err := await(t, served, "Serve's return after Shutdown"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, wait); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	if err := srv.Serve(l); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown returned %v", err)
	}
}
