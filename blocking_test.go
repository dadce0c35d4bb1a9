package monolock

import (
	"bytes"
	"fmt"
	"math"
	"net"
	"testing"
	"time"
)

// answers is how long a call that takes the table's mutex may take while a
// write to another client is blocked: it should not wait for that write at
// all, and the write blocks for a minute.
const answers = 3 * time.Second

// within runs f and fails the test if it has not returned within d, or
// with what f says went wrong. f reports rather than fails: it may outlive
// the test.
func within(t *testing.T, d time.Duration, what string, f func() string) {
	t.Helper()
	done := make(chan string, 1)
	go func() { done <- f() }()
	select {
	case problem := <-done:
		if problem != "" {
			t.Fatalf("%s: %s", what, problem)
		}
	case <-time.After(d):
		t.Fatalf("%s did not answer within %v while a promotion push was blocked", what, d)
	}
}

// A waiter that floods heartbeats and never reads has its buffers full,
// so the server's writes to it block; the promotion pushed to it blocks
// too. The table must stay free meanwhile: the push is network I/O and
// is written outside the table's mutex.
func TestBlockedPromotionPushDelaysNobody(t *testing.T) {
	srv := &Server{IOTimeout: time.Minute}
	l := startServerWatched(t, srv)
	addr := l.Addr().String()

	holder := dialRaw(t, addr)
	holder.send(acquire("promo", time.Minute))
	holder.expectAcquired()

	waiter := dialRaw(t, addr)
	waiter.Conn.(*net.TCPConn).SetReadBuffer(1024)
	waiter.send(acquire("promo", time.Minute))
	waiter.expectWaiting()
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		flood := bytes.Repeat([]byte{TypeHeartbeat}, 1<<16)
		for {
			if _, err := waiter.Conn.Write(flood); err != nil {
				return // closed by dialRaw's cleanup
			}
		}
	}()
	t.Cleanup(func() {
		waiter.Close()
		select {
		case <-flooding:
		case <-time.After(wait):
			t.Errorf("the flooding writer did not stop within %v of its connection's close", wait)
		}
	})
	client := waiter.LocalAddr().String()
	waitFor(t, "a blocked write to the waiter that never reads", func() bool {
		return l.blockedFor(client) > 500*time.Millisecond
	})

	// The holder leaves: the lock goes to the waiter, whose push blocks
	// behind the blocked WAITING.
	holder.Close()
	deadline := time.Now().Add(wait)
	for promoted := false; !promoted; {
		var got bool
		within(t, answers, "Lock", func() string {
			info, ok := srv.Lock("promo")
			got = ok && info.Holder != nil && info.Holder.RemoteAddr == client
			return ""
		})
		promoted = got
		if time.Now().After(deadline) {
			t.Fatalf("the waiter was not promoted within %v of the holder's close", wait)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the push is under way by now, blocked

	within(t, answers, "Stats", func() string {
		if st := srv.Stats(); st.LocksHeld != 1 || st.Waiters != 0 {
			return fmt.Sprintf("%d held, %d waiting during the blocked push; want 1, 0", st.LocksHeld, st.Waiters)
		}
		return ""
	})
	within(t, answers, "Locks", func() string {
		if locks := srv.Locks(); len(locks) != 1 || locks[0].Name != "promo" {
			return fmt.Sprintf("%+v during the blocked push", locks)
		}
		return ""
	})
	other := dialRaw(t, addr)
	other.patience = answers
	start := time.Now()
	other.send(acquire("unrelated", time.Minute))
	other.expectAcquired()
	queued := dialRaw(t, addr)
	queued.patience = answers
	queued.send(acquire("promo", time.Minute))
	queued.expectWaiting()
	if d := time.Since(start); d > answers {
		t.Fatalf("two ACQUIREs took %v while a promotion push was blocked", d)
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
