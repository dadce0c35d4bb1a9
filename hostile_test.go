package monolock

import (
	"net"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Thousands of connections that never send a byte are all closed at the
// io-timeout, and meanwhile a normal client is served as usual.
func TestSilentConnectionsAreCutAndDelayNobody(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 5,000 connections")
	}
	const n = 5000
	const ioTimeout = 2 * time.Second
	addr := startServer(t, &Server{IOTimeout: ioTimeout})
	silent := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	opened := time.Now()
	for range n {
		c, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			t.Fatalf("after %d connections: %v", len(silent), err)
		}
		silent = append(silent, c)
	}

	// A normal client, acquiring and releasing while they sit there.
	var cycles []time.Duration
	for i := 0; i == 0 || time.Since(opened) < ioTimeout; i++ { // one at least, however slow the dials
		start := time.Now()
		c := dialRaw(t, addr)
		c.send(acquire("normal-"+strconv.Itoa(i), time.Minute))
		c.expectAcquired()
		c.Close()
		cycles = append(cycles, time.Since(start))
	}
	slices.Sort(cycles)
	if worst := cycles[len(cycles)-1]; worst > time.Second {
		t.Errorf("a normal acquire took %v beside %d silent connections", worst, n)
	}
	t.Logf("%d acquire-release cycles beside %d silent connections: median %v, worst %v",
		len(cycles), n, cycles[len(cycles)/2], cycles[len(cycles)-1])

	// Every silent connection is closed by the io-timeout, none earlier.
	for i, c := range silent {
		c.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeoutErr(err) {
			t.Fatalf("silent connection %d not closed: %v", i, err)
		}
		if i == 0 && time.Since(opened) < ioTimeout {
			t.Fatalf("closed after %v, before the io-timeout", time.Since(opened))
		}
	}
}

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A name_len of 65535 is refused at once, without reading the name; a
// frame that trickles in holds no more than the protocol's limit.
func TestHugeNameLenHoldsNoMemory(t *testing.T) {
	srv := &Server{IOTimeout: time.Minute}
	addr := startServer(t, srv)
	huge := []byte{TypeAcquire, 1, 0, 0, 0x27, 0x10, 0xff, 0xff, 'a'}
	start := time.Now()
	for range 50 {
		c := dialRaw(t, addr)
		c.sendBytes(huge) // and then it would trickle the rest, a byte at a time
		c.expectError(CodeNameTooLong)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refusing 50 huge names took %v", d)
	}

	// 1,000 connections each stuck halfway through the longest name the
	// protocol allows: the server holds the sessions and little else.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 1000
	partial := []byte{TypeAcquire, 1, 0, 0, 0x27, 0x10, 0, 255}
	partial = append(partial, make([]byte, 100)...)
	for i := range n {
		c := dialRaw(t, addr)
		partial[9] = byte(i)
		c.sendBytes(partial)
	}
	waitFor(t, "every connection to be accepted", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) >= n
	})
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Both ends are in this process; a 64 KiB buffer per name would show.
	per := (int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)) / n
	if per > 16<<10 {
		t.Fatalf("%d bytes per half-sent ACQUIRE", per)
	}
	t.Logf("%d bytes of heap and stack per half-sent ACQUIRE, both ends", per)
}

// An idle session's goroutine keeps the smallest stack Go gives: the first
// frame's deeper work is done on a goroutine that then ends (see serve).
// 4 KiB a session here would mean a stack that grew and stayed grown.
func TestIdleSessionsKeepSmallStacks(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector enlarges every frame")
	}
	srv := &Server{}
	addr := startServer(t, srv)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 2000
	for i := range n {
		c := dialRaw(t, addr)
		c.send(acquire("stack-"+strconv.Itoa(i), time.Minute), heartbeat)
		c.expectAcquired()
		c.expectAcquired()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.StackInuse) - int64(before.StackInuse)) / n
	t.Logf("%d bytes of stack per idle session", per)
	if per > 3<<10 {
		t.Fatalf("%d bytes of stack per idle session, want about 2 KiB", per)
	}
}
