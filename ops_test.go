package monolock

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// eventLog collects what OnEvent is told.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

// types returns the event types so far, each as "type lock".
func (l *eventLog) types() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ev := range l.events {
		out = append(out, ev.Type+" "+ev.Lock)
	}
	return out
}

func TestForceReleaseAndKickWaiter(t *testing.T) {
	var log eventLog
	srv := &Server{OnEvent: log.add}
	addr := startServer(t, srv)
	holder, waiters, _ := queue(t, addr, "stuck", 4)
	info, ok := srv.Lock("stuck")
	if !ok || info.Holder == nil || len(info.Waiters) != 4 || info.Holder.RemoteAddr != holder.LocalAddr().String() {
		t.Fatalf("snapshot %+v", info)
	}
	for i, w := range info.Waiters {
		if w.RemoteAddr != waiters[i].LocalAddr().String() || w.Lease != time.Minute {
			t.Fatalf("waiter %d in the snapshot is %+v", i, w)
		}
	}

	// Kick the second waiter: it alone goes, with 0x02.
	if _, err := srv.KickWaiter("stuck", waiters[1].LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	waiters[1].expectError(CodeClosedByAdmin)
	if _, err := srv.KickWaiter("stuck", "127.0.0.1:1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("kick of an unknown waiter: %v", err)
	}

	// Force-release the holder: 0x02 to it, the lock to the first waiter.
	got, err := srv.ForceRelease("stuck", 0)
	if err != nil || got.Token == 0 {
		t.Fatalf("ForceRelease = %+v, %v", got, err)
	}
	holder.expectError(CodeClosedByAdmin)
	waiters[0].expectAcquired()
	waiters[2].send(heartbeat)
	waiters[2].expectWaiting()
	waitFor(t, "the queue to shrink", func() bool {
		info, _ := srv.Lock("stuck")
		return len(info.Waiters) == 2
	})
	info, _ = srv.Lock("stuck")
	if info.Waiters[0].RemoteAddr != waiters[2].LocalAddr().String() || info.Waiters[1].RemoteAddr != waiters[3].LocalAddr().String() {
		t.Fatalf("queue after the kicks: %+v", info.Waiters)
	}
	if _, err := srv.ForceRelease("idle", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ForceRelease of an idle lock: %v", err)
	}

	want := []string{"granted stuck", "kick_waiter stuck", "force_release stuck", "released stuck", "granted stuck"}
	waitFor(t, "the events", func() bool { return len(log.types()) == len(want) })
	for i, got := range log.types() {
		if got != want[i] {
			t.Fatalf("events %q, want %q", log.types(), want)
		}
	}
	log.mu.Lock()
	released := log.events[3]
	log.mu.Unlock()
	if released.Reason != ReasonForce || released.Token != got.Token || released.RemoteAddr != holder.LocalAddr().String() {
		t.Fatalf("release %+v", released)
	}
}

func TestStatsCountWhatHappened(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	a := dialRaw(t, addr)
	a.send(acquire("a", time.Minute))
	a.expectAcquired()
	b := dialRaw(t, addr)
	b.send(acquire("a", time.Minute))
	b.expectWaiting()
	short := dialRaw(t, addr)
	short.send(acquire("short", 100*time.Millisecond))
	short.expectAcquired()
	for range 3 {
		a.send(heartbeat)
		a.expectAcquired()
	}
	bad := dialRaw(t, addr)
	bad.sendBytes([]byte{0x7f})
	bad.expectError(CodeUnknownType)
	short.expectClosed(wait) // expired
	a.Close()                // graceful; b is promoted
	b.expectAcquired()
	waitFor(t, "the counters", func() bool {
		st := srv.Stats()
		return st.Releases[ReasonGraceful] == 1 && st.Connections == 1
	})
	st := srv.Stats()
	if st.ConnectionsAccepted != 4 || st.Acquires != 3 || st.Grants != 3 || st.Heartbeats != 3 ||
		st.LocksHeld != 1 || st.Waiters != 0 || st.Releases[ReasonExpired] != 1 ||
		st.Errors[CodeUnknownType] != 1 || len(st.Errors) != 1 || st.WaitTotal <= 0 || st.HoldTotal <= 0 {
		t.Fatalf("stats %+v", st)
	}
}
