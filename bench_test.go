package monolock

import (
	"bufio"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Each benchmark runs against monolock and against a floor: a TCP
// responder that does the same socket work with no lock table, so that
// the ratio of the two is the cost of monolock itself on this machine.
//
//	go test -run '^$' -bench . -count 5

// BenchmarkHandover measures the time from a holder closing its connection
// to its waiter reading the pushed ACQUIRED.
func BenchmarkHandover(b *testing.B) {
	b.Run("monolock", func(b *testing.B) { benchHandover(b, startServer(b, &Server{})) })
	b.Run("floor", func(b *testing.B) { benchHandover(b, startFloor(b, true)) })
}

func benchHandover(b *testing.B, addr string) {
	holder := dialRaw(b, addr)
	holder.send(acquire("handover", 60e9))
	holder.expectAcquired()
	for range b.N {
		b.StopTimer()
		waiter := dialRaw(b, addr)
		waiter.send(acquire("handover", 60e9))
		waiter.expectWaiting()
		time.Sleep(100 * time.Microsecond) // the server settles: only the handover is timed
		waiter.SetReadDeadline(time.Now().Add(wait))
		b.StartTimer()
		holder.Close()
		if f, err := ReadFrame(waiter); err != nil || f.Type != TypeAcquired {
			b.Fatalf("waiter read %+v, %v; want the pushed ACQUIRED within %v", f, err, wait)
		}
		holder = waiter
	}
}

// BenchmarkAcquireRelease measures dial, ACQUIRE, read ACQUIRED, close,
// by 1 and by 8 clients at once, each on locks of its own.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, clients := range []int{1, 8} {
		name := "clients=" + strconv.Itoa(clients)
		b.Run(name+"/monolock", func(b *testing.B) { benchAcquireRelease(b, startServer(b, &Server{}), clients) })
		b.Run(name+"/floor", func(b *testing.B) { benchAcquireRelease(b, startFloor(b, false), clients) })
	}
}

func benchAcquireRelease(b *testing.B, addr string, clients int) {
	var wg sync.WaitGroup
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Go(func() {
			prefix := "bench-" + strconv.Itoa(c) + "-"
			var buf []byte
			for i := range n {
				conn, err := net.DialTimeout("tcp", addr, wait)
				if err != nil {
					b.Error(err)
					return
				}
				conn.SetDeadline(time.Now().Add(wait))
				buf, _ = acquire(prefix+strconv.Itoa(i), 60e9).AppendBinary(buf[:0])
				conn.Write(buf)
				if f, err := ReadFrame(conn); err != nil || f.Type != TypeAcquired {
					b.Errorf("read %+v, %v; want ACQUIRED within %v", f, err, wait)
				}
				conn.Close()
			}
		})
	}
	awaitFunc(b, "the end of every client's cycles", wg.Wait)
}

// startFloor serves the floor: every ACQUIRE is granted at once, or, with
// oneLock, the first connection holds, the next one waits, and the
// holder's EOF is relayed as ACQUIRED to the waiter.
func startFloor(tb testing.TB, oneLock bool) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var holder, waiter net.Conn
	acquired := []byte{TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetReadDeadline(time.Now().Add(time.Minute)) // a floor client lives a benchmark at most
				r := bufio.NewReaderSize(conn, 64)
				if _, err := ReadFrame(r); err != nil {
					return
				}
				reply := acquired
				if oneLock {
					mu.Lock()
					if holder == nil {
						holder = conn
					} else {
						waiter, reply = conn, []byte{TypeWaiting}
					}
					mu.Unlock()
				}
				conn.Write(reply)
				r.ReadByte() // until EOF
				if oneLock {
					var next net.Conn
					mu.Lock()
					if holder == conn {
						next, holder, waiter = waiter, waiter, nil
					}
					mu.Unlock()
					if next != nil {
						next.Write(acquired)
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}
